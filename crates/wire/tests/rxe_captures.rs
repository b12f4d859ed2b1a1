//! uroce against real traffic of the Linux kernel's RoCEv2 implementation (rxe).
//!
//! For every packet of every `*.pcap` in the rxe captures directory
//! (`$UROCE_RXE_CAPTURES`, else the fixtures in `tests/fixtures/rxe/`, recorded by the
//! interop suite between Linux rxe guests and between rxe and uroce; their README says
//! how):
//! * the pcap / pcapng reader yields the frames with the lengths and timestamps tshark
//!   reads;
//! * the frame splits into Ethernet / IP / UDP ([`PcapReader::datagram`]) and the UDP
//!   payload parses with [`PacketRepr::parse`];
//! * its opcode and headers equal tshark's decode of the same packet (tshark runs once
//!   per file);
//! * [`PacketRepr::emit`] reproduces the captured bytes exactly, once the captured ICRC is
//!   written back (BTH..ICRC byte-identical);
//! * [`icrc::compute`] over the captured IP and UDP headers equals the ICRC on the wire
//!   (rxe's IPv4 Identification is non-zero and covered, so this exercises the masking);
//! * CM MADs (UD SEND to QP 1) have management class 0x07 and the attribute ID tshark shows.

use uroce_testkit as support;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Duration;

use uroce_wire::pcap::PcapReader;
use uroce_wire::{icrc, mad, packet, PacketRepr};

const TEST: &str = "rxe_captures";

fn captures_dir() -> PathBuf {
    match std::env::var_os("UROCE_RXE_CAPTURES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rxe"),
    }
}

/// Per-file tallies, printed at the end.
#[derive(Default)]
struct Tally {
    packets: usize,
    cm_mads: usize,
    opcodes: BTreeMap<u8, usize>,
}

fn check_file(path: &Path) -> Tally {
    let name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let reader = PcapReader::new(BufReader::new(File::open(path).unwrap()))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let link = reader
        .link_type()
        .unwrap_or_else(|| panic!("{name}: unsupported link type {}", reader.linktype()));
    let frames: Vec<(Duration, Vec<u8>)> = reader
        .map(|r| r.unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect();

    let mut fields = vec![
        "frame.number",
        "frame.time_epoch",
        "frame.cap_len",
        "infiniband.mad.mgmtclass",
        "infiniband.mad.attributeid",
    ];
    fields.extend_from_slice(support::IB_FIELDS);
    let rows = support::tshark_fields(path, &fields, &[]);
    assert_eq!(
        rows.len(),
        frames.len(),
        "{name}: tshark and uroce count different packets"
    );

    let mut tally = Tally::default();
    for (i, ((ts, frame), row)) in frames.iter().zip(&rows).enumerate() {
        let what = format!("{name} packet {}", i + 1);
        assert_eq!(row.number("frame.number"), Some(i as u64 + 1), "{what}");
        // The pcap/pcapng reader: same capture length and timestamp as tshark reads.
        assert_eq!(
            row.number("frame.cap_len"),
            Some(frame.len() as u64),
            "{what}"
        );
        let epoch = format!("{}.{:09}", ts.as_secs(), ts.subsec_nanos());
        assert_eq!(
            row.single("frame.time_epoch"),
            Some(epoch.as_str()),
            "{what}: timestamp"
        );
        let d = link
            .datagram(frame)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let roce = d.roce().unwrap_or_else(|e| panic!("{what}: {e}"));
        let repr = PacketRepr::parse(roce).unwrap_or_else(|e| panic!("{what}: {e}"));

        // ICRC: recomputed over the captured headers, equal to the wire value.
        let on_wire = packet::icrc_on_wire(roce).unwrap();
        let body = &roce[..roce.len() - uroce_wire::ICRC_LEN];
        let computed = icrc::compute(d.ip_header, d.udp_header, body)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(computed, on_wire, "{what}: ICRC (computed vs on the wire)");
        icrc::verify(d.ip_header, d.udp_header, roce).unwrap();

        // tshark's decode.
        support::check_decoded(row, &repr, repr.bth.pad_cnt, on_wire, &what);

        // Emit reproduces the captured bytes.
        let mut emitted = vec![0u8; repr.buffer_len()];
        let n = repr
            .emit(&mut emitted)
            .unwrap_or_else(|e| panic!("{what}: emit: {e}"));
        assert_eq!(n, roce.len(), "{what}: emitted length");
        emitted[n - 4..].copy_from_slice(&on_wire.to_le_bytes());
        if emitted != roce {
            let at = emitted
                .iter()
                .zip(roce)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!(
                "{what}: emit differs from the capture at byte {at}: {:02x?} vs {:02x?}",
                &emitted[at..(at + 8).min(n)],
                &roce[at..(at + 8).min(n)]
            );
        }

        // CM MADs: UD SEND_ONLY to the GSI QP.
        if repr.deth.is_some() && repr.bth.dest_qp == mad::GSI_QPN {
            let header = mad::Header::new_checked(repr.payload)
                .unwrap_or_else(|e| panic!("{what}: MAD: {e}"));
            assert_eq!(
                header.mgmt_class(),
                mad::MGMT_CLASS_CM,
                "{what}: management class"
            );
            assert_eq!(
                row.number("infiniband.mad.mgmtclass"),
                Some(u64::from(mad::MGMT_CLASS_CM))
            );
            assert_eq!(
                row.number("infiniband.mad.attributeid"),
                Some(u64::from(header.attribute_id())),
                "{what}: MAD attribute ID"
            );
            tally.cm_mads += 1;
        }
        tally.packets += 1;
        *tally.opcodes.entry(repr.bth.opcode).or_default() += 1;
    }
    tally
}

#[test]
fn rxe_captures_parse_emit_icrc_and_match_tshark() {
    let dir = captures_dir();
    assert!(
        dir.is_dir(),
        "no rxe captures directory at {}",
        dir.display()
    );
    if !support::have_tshark(TEST) {
        return;
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *.pcap in {}", dir.display());

    let mut total = 0;
    let mut seen = std::collections::BTreeSet::new();
    let mut cm_mads = 0;
    for path in &files {
        let t = check_file(path);
        seen.extend(t.opcodes.keys().copied());
        cm_mads += t.cm_mads;
        let opcodes: Vec<String> = t
            .opcodes
            .iter()
            .map(|(op, n)| format!("{op:#04x}×{n}"))
            .collect();
        eprintln!(
            "{}: {} packets, {} CM MADs; opcodes {}",
            path.file_name().unwrap_or_default().to_string_lossy(),
            t.packets,
            t.cm_mads,
            opcodes.join(" ")
        );
        assert!(t.packets > 0, "{}: no packets", path.display());
        total += t.packets;
    }
    eprintln!(
        "{TEST}: {total} packets in {} files all checked",
        files.len()
    );
    // The set must keep covering what rxe sends: RC SEND First/Middle/Last/Only,
    // RDMA WRITE First/Middle/Last/Only, READ Request and Response First/Middle/Last/Only,
    // Acknowledge, Atomic Acknowledge, Compare&Swap, Fetch&Add, UC SEND First/Middle/Last,
    // UD SEND Only (with and without immediate), and CM MADs.
    let wanted: [u8; 22] = [
        0x00, 0x01, 0x02, 0x04, 0x06, 0x07, 0x08, 0x0a, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12,
        0x13, 0x14, 0x20, 0x21, 0x22, 0x64, 0x65,
    ];
    let missing: Vec<String> = wanted
        .iter()
        .filter(|op| !seen.contains(op))
        .map(|op| format!("{op:#04x}"))
        .collect();
    if std::env::var_os("UROCE_RXE_CAPTURES").is_none() {
        assert!(
            missing.is_empty(),
            "no packet with opcode {}",
            missing.join(", ")
        );
        assert!(cm_mads > 0, "no CM MAD in the fixtures");
    }
}
