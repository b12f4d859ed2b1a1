//! `uroce capture FILE.pcap`: a quick local perf pair with capture on the client's device;
//! tshark must read the file with nothing malformed, see every operation of the standard
//! set, and `uroce decode` must find every ICRC good.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::{have_tshark, num, run_uroce, tshark_decode, TempFile, PI_WARN};

const TEST: &str = "capture";

#[test]
fn capture_writes_a_pcap_tshark_reads() {
    let file = TempFile::new("capture", "pcap");
    let path = file.path().to_str().expect("utf-8 path");
    let out = run_uroce(
        &[
            "capture",
            path,
            "--addr",
            "127.0.1.20",
            "--",
            "--server-addr",
            "127.0.1.21",
            "--oob-port",
            "18540",
            "--no-progress",
        ],
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("capture: wrote"), "{}", out.stdout);

    // uroce's own decoder: every packet RoCEv2 with a good ICRC (exit status 0).
    let dec = run_uroce(&["decode", path], Duration::from_secs(60));
    assert!(dec.status.success(), "{}", dec.stdout);

    if !have_tshark(TEST) {
        return;
    }
    let rows = tshark_decode(file.path());
    assert!(rows.len() > 100, "only {} packets", rows.len());
    let mut opcodes = BTreeSet::new();
    for row in &rows {
        let what = format!("frame {:?}", row.single("frame.number"));
        assert!(row.all("_ws.malformed").is_empty(), "{what}: malformed");
        for (sev, msg) in row
            .all("_ws.expert.severity")
            .iter()
            .zip(row.all("_ws.expert.message"))
        {
            assert!(num(sev) < PI_WARN, "{what}: expert info {sev} {msg:?}");
        }
        assert_eq!(row.number("udp.dstport"), Some(4791), "{what}");
        // ip.checksum.status: 0 bad, 1 good, 2 unverified.
        assert_eq!(row.number("ip.checksum.status"), Some(1), "{what}");
        opcodes.insert(row.number("infiniband.bth.opcode").expect("BTH opcode"));
    }
    // RC opcodes (IBA table): SEND FIRST/MIDDLE/LAST/ONLY 0-4, WRITE FIRST/MIDDLE/LAST/ONLY
    // 6-10, READ request 12, READ response FIRST/MIDDLE/LAST/ONLY 13-16, ACK 17, ATOMIC ACK
    // 18, FETCH_ADD 20.
    for op in [0, 1, 2, 4, 6, 7, 8, 10, 12, 13, 14, 15, 16, 17, 18, 20] {
        assert!(opcodes.contains(&op), "opcode {op} missing: {opcodes:?}");
    }
}
