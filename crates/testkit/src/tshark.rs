//! Reading tshark's decode of a capture file and comparing it with uroce's view of the
//! same packets.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::tools::{run, tshark};

/// Upper-layer protocols tshark tries heuristically on SEND payloads (`tshark -G
/// heuristic-decodes`, table `infiniband.payload`). Test payloads are random bytes, which
/// some of them misread ("Malformed Packet: RPCoRDMA"), so they are all disabled.
pub const PAYLOAD_DISSECTORS: &[&str] = &[
    "rpcordma",
    "smc",
    "smb_direct",
    "nvme-rdma",
    "lnet",
    "iser",
    "eoib",
    "infiniband_sdp",
    "fcoib",
];

/// One packet of tshark's `-T fields` output: for each requested field the list of its
/// values (empty when absent; several when the field occurs several times).
pub struct Row {
    names: Vec<String>,
    cells: Vec<Vec<String>>,
}

impl Row {
    /// All values of `field` (which must have been requested).
    pub fn all(&self, field: &str) -> &[String] {
        let i = self
            .names
            .iter()
            .position(|n| n == field)
            .unwrap_or_else(|| panic!("{field} was not requested from tshark"));
        &self.cells[i]
    }

    /// The value of `field`, if present; a field listed several times must repeat the same
    /// value (tshark 4.0 lists ImmDt twice).
    pub fn single(&self, field: &str) -> Option<&str> {
        let cell = self.all(field);
        let first = cell.first()?;
        assert!(
            cell.iter().all(|v| v == first),
            "{field}: differing values {cell:?}"
        );
        Some(first)
    }

    /// `field` as a number (see [`num`]).
    pub fn number(&self, field: &str) -> Option<u64> {
        self.single(field).map(num)
    }

    /// An FT_BYTES field (bare hex digits, possibly with ':') as a number.
    pub fn bytes_number(&self, field: &str) -> Option<u64> {
        self.single(field).map(|s| {
            let digits: String = s.chars().filter(char::is_ascii_hexdigit).collect();
            u64::from_str_radix(&digits, 16).unwrap_or_else(|e| panic!("{field} {s:?}: {e}"))
        })
    }
}

/// Runs tshark on `file` (payload heuristics off, `extra` options added) and returns one
/// [`Row`] per packet with the requested `fields`.
pub fn tshark_fields(file: &Path, fields: &[&str], extra: &[&str]) -> Vec<Row> {
    let mut cmd = Command::new(tshark());
    cmd.arg("-n").arg("-r").arg(file);
    for proto in PAYLOAD_DISSECTORS {
        cmd.args(["--disable-protocol", proto]);
    }
    cmd.args(extra);
    cmd.args([
        "-T",
        "fields",
        "-E",
        "separator=/t",
        "-E",
        "occurrence=a",
        "-E",
        "aggregator=|",
    ]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = run(cmd, Duration::from_secs(120)).unwrap_or_else(|e| panic!("tshark: {e}"));
    assert!(
        out.status.success(),
        "tshark failed ({}): {}",
        out.status,
        out.stderr
    );
    let names: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
    out.stdout
        .lines()
        .map(|line| {
            let cells: Vec<Vec<String>> = line
                .split('\t')
                .map(|cell| {
                    if cell.is_empty() {
                        Vec::new()
                    } else {
                        cell.split('|').map(str::to_string).collect()
                    }
                })
                .collect();
            assert_eq!(
                cells.len(),
                fields.len(),
                "tshark row has the wrong column count: {line:?}"
            );
            Row {
                names: names.clone(),
                cells,
            }
        })
        .collect()
}

/// The InfiniBand fields [`check_decoded`] compares (names from `tshark -G fields`).
/// tshark shows the AtomicETH VA and R_Key under the RETH field names.
pub const IB_FIELDS: &[&str] = &[
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.m",
    "infiniband.bth.padcnt",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.psn",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.ieth",
    "infiniband.invariant.crc",
];

/// Whether tshark 4.0 decodes anything after the BTH of `opcode`: it names the XRC
/// opcodes 0xA0-0xB7 but decodes nothing after their BTH (not the XRCETH, and not the
/// AETH etc. of XRC responses either), and calls FLUSH (0x1C), ATOMIC_WRITE (0x1D) and the
/// RoCEv2 CNP (0x81) unknown. For those it shows no ICRC either.
pub fn tshark_decodes_extension_headers(opcode: u8) -> bool {
    use uroce_wire::opcode::{Operation, Transport};
    let Some(info) = uroce_wire::opcode::info(opcode) else {
        return false;
    };
    let unknown = matches!(
        info.operation,
        Operation::Flush | Operation::AtomicWrite | Operation::Cnp
    );
    info.transport != Transport::Xrc && !unknown
}

/// Asserts that tshark's decode (`row`, with [`IB_FIELDS`]) shows `repr` (headers as
/// emitted or parsed; `pad` its PadCnt) and the ICRC `icrc`, as far as tshark decodes
/// that opcode.
pub fn check_decoded(row: &Row, repr: &uroce_wire::PacketRepr<'_>, pad: u8, icrc: u32, what: &str) {
    let b = &repr.bth;
    let eq = |field: &str, want: Option<u64>| {
        assert_eq!(row.number(field), want, "{what}: {field}");
    };
    eq("infiniband.bth.opcode", Some(u64::from(b.opcode)));
    eq("infiniband.bth.se", Some(u64::from(b.solicited)));
    eq("infiniband.bth.m", Some(u64::from(b.mig_req)));
    eq("infiniband.bth.padcnt", Some(u64::from(pad)));
    eq("infiniband.bth.p_key", Some(u64::from(b.pkey)));
    eq("infiniband.bth.destqp", Some(u64::from(b.dest_qp)));
    eq("infiniband.bth.a", Some(u64::from(b.ack_req)));
    eq("infiniband.bth.psn", Some(u64::from(b.psn.value())));
    if !tshark_decodes_extension_headers(b.opcode) {
        return;
    }
    // tshark prints the four ICRC wire bytes as a big-endian number: byte-swapped.
    eq(
        "infiniband.invariant.crc",
        Some(u64::from(icrc.swap_bytes())),
    );
    let va = repr.reth.map(|x| x.va).or(repr.atomic_eth.map(|x| x.va));
    let rkey = repr
        .reth
        .map(|x| x.rkey)
        .or(repr.atomic_eth.map(|x| x.rkey));
    eq("infiniband.reth.va", va);
    eq("infiniband.reth.r_key", rkey.map(u64::from));
    eq(
        "infiniband.reth.dmalen",
        repr.reth.map(|x| u64::from(x.dma_len)),
    );
    eq(
        "infiniband.aeth.syndrome",
        repr.aeth.map(|x| u64::from(x.syndrome.to_byte())),
    );
    eq("infiniband.aeth.msn", repr.aeth.map(|x| u64::from(x.msn)));
    eq(
        "infiniband.deth.q_key",
        repr.deth.map(|x| u64::from(x.qkey)),
    );
    eq(
        "infiniband.deth.srcqp",
        repr.deth.map(|x| u64::from(x.src_qp)),
    );
    eq(
        "infiniband.atomiceth.swapdt",
        repr.atomic_eth.map(|x| x.swap_add),
    );
    eq(
        "infiniband.atomiceth.cmpdt",
        repr.atomic_eth.map(|x| x.compare),
    );
    eq(
        "infiniband.atomicacketh.origremdt",
        repr.atomic_ack_eth.map(|x| x.orig),
    );
    let imm = repr.immdt.map(|x| u64::from(x.imm));
    assert_eq!(
        row.bytes_number("infiniband.immdt"),
        imm,
        "{what}: infiniband.immdt"
    );
    let inv = repr.ieth.map(|x| u64::from(x.rkey));
    assert_eq!(
        row.bytes_number("infiniband.ieth"),
        inv,
        "{what}: infiniband.ieth"
    );
}

/// Parses a tshark number: decimal, or hex with `0x`; booleans as 0/1 ("True"/"False").
pub fn num(s: &str) -> u64 {
    let s = s.trim();
    match s {
        "True" | "true" => return 1,
        "False" | "false" => return 0,
        _ => {}
    }
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse::<u64>(),
    };
    parsed.unwrap_or_else(|e| panic!("tshark value {s:?} is not a number: {e}"))
}

/// Wireshark's expert severity of "warning" (PI_WARN); errors are higher.
pub const PI_WARN: u64 = 0x0060_0000;

/// The per-packet fields that [`tshark_decode`] requests besides [`IB_FIELDS`]: frame
/// number, the malformed-packet marker, expert infos (severity and message), the IPv4
/// header checksum status and the UDP destination port.
pub const FRAME_FIELDS: &[&str] = &[
    "frame.number",
    "_ws.malformed",
    "_ws.expert.severity",
    "_ws.expert.message",
    "ip.checksum.status",
    "udp.dstport",
];

/// Runs tshark on `file` with IPv4 header checksum validation on and returns one [`Row`]
/// per packet with [`FRAME_FIELDS`] and [`IB_FIELDS`].
pub fn tshark_decode(file: &Path) -> Vec<Row> {
    let mut fields = FRAME_FIELDS.to_vec();
    fields.extend_from_slice(IB_FIELDS);
    tshark_fields(file, &fields, &["-o", "ip.check_checksum:TRUE"])
}
