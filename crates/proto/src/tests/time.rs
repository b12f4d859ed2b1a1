use super::*;

#[test]
fn ack_timeout_values() {
    assert_eq!(local_ack_timeout(0), None);
    assert_eq!(local_ack_timeout(1), Some(Duration::from_nanos(8192)));
    // 14 → 4.096 µs × 16384 = 67.108864 ms (rxe resends every ~68 ms at timeout 14).
    assert_eq!(
        local_ack_timeout(14),
        Some(Duration::from_nanos(67_108_864))
    );
    assert_eq!(local_ack_timeout(31), local_ack_timeout(200));
}

#[test]
fn instant_arithmetic_saturates() {
    let t = Instant::from_nanos(10);
    assert_eq!((t + Duration::from_nanos(5)).as_nanos(), 15);
    assert_eq!(
        Instant::from_nanos(u64::MAX) + Duration::from_secs(1),
        Instant::from_nanos(u64::MAX)
    );
    assert_eq!(
        t.saturating_duration_since(Instant::from_nanos(20)),
        Duration::ZERO
    );
}
