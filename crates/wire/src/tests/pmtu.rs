use super::*;

#[test]
fn enum_values_and_bytes() {
    let expect = [(1, 256), (2, 512), (3, 1024), (4, 2048), (5, 4096)];
    for (e, b) in expect {
        let m = Pmtu::from_enum(e).expect("valid enum");
        assert_eq!(m.bytes(), b);
        assert_eq!(m.enum_value(), e);
        assert_eq!(Pmtu::from_bytes(b), Some(m));
    }
    assert_eq!(Pmtu::from_enum(0), None);
    assert_eq!(Pmtu::from_enum(6), None);
    assert_eq!(Pmtu::from_bytes(1500), None);
}

#[test]
fn packet_counts() {
    let m = Pmtu::Mtu1024;
    assert_eq!(m.packets_for(0), 1);
    assert_eq!(m.packets_for(1), 1);
    assert_eq!(m.packets_for(1024), 1);
    assert_eq!(m.packets_for(1025), 2);
    assert_eq!(m.packets_for(4096), 4);
    assert_eq!(Pmtu::Mtu256.packets_for(1 << 30), 1 << 22);
}

#[test]
fn link_mtu_to_path_mtu() {
    // rxe: largest IB MTU <= netdev MTU - 80 (docs/INTEROP-NOTES.md §4).
    assert_eq!(Pmtu::largest_fitting(1500, 80), Some(Pmtu::Mtu1024));
    assert_eq!(Pmtu::largest_fitting(9000, 80), Some(Pmtu::Mtu4096));
    assert_eq!(Pmtu::largest_fitting(65536, 80), Some(Pmtu::Mtu4096));
    assert_eq!(Pmtu::largest_fitting(300, 80), None);
}
