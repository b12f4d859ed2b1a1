//! Helpers shared by the tests that cross-check uroce against external tools: finding the
//! tools, running them with a time limit, and unique temporary files.
//!
//! Policy: when a tool is missing the test prints a skip note and passes, unless the
//! environment sets `UROCE_REQUIRE_TOOLS=1` (as `scripts/test` does), in which case it
//! fails with a message saying what to install.
#![allow(dead_code)] // each test binary uses a different subset

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// True when missing tools must fail the test (`UROCE_REQUIRE_TOOLS=1`).
pub fn tools_required() -> bool {
    std::env::var("UROCE_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// Reports that a test cannot run: panics when tools are required, else prints a note.
/// Returns normally only in the second case (the caller then returns early).
pub fn skip(test: &str, why: &str) {
    if tools_required() {
        panic!("{test}: {why} (UROCE_REQUIRE_TOOLS=1 makes this a failure)");
    }
    eprintln!("SKIP {test}: {why} (set UROCE_REQUIRE_TOOLS=1 to make this a failure)");
}

/// What a finished external process produced.
pub struct Output {
    /// Exit status.
    pub status: ExitStatus,
    /// Standard output, lossily decoded.
    pub stdout: String,
    /// Standard error, lossily decoded.
    pub stderr: String,
}

/// Runs `cmd` to completion, killing it after `limit`. Output goes through temporary
/// files (no pipe can fill up). `Err` if it cannot start or runs past the limit.
pub fn run(mut cmd: Command, limit: Duration) -> Result<Output, String> {
    let out_file = TempFile::new("stdout", "txt");
    let err_file = TempFile::new("stderr", "txt");
    let out = File::create(out_file.path()).map_err(|e| e.to_string())?;
    let err = File::create(err_file.path()).map_err(|e| e.to_string())?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{:?} ran longer than {limit:?} and was killed",
                    cmd.get_program()
                ));
            }
            Err(e) => return Err(format!("waiting for {:?}: {e}", cmd.get_program())),
        }
    };
    Ok(Output {
        status,
        stdout: read_lossy(out_file.path()),
        stderr: read_lossy(err_file.path()),
    })
}

fn read_lossy(path: &Path) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Checks that `program args…` runs and exits 0 within 60 s; `Err` says why not.
pub fn probe(program: &str, args: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    match run(cmd, Duration::from_secs(60)) {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            o.stderr.trim()
        )),
        Err(e) => Err(e),
    }
}

/// The tshark binary: `$UROCE_TSHARK`, else `tshark` from `PATH`.
pub fn tshark() -> String {
    std::env::var("UROCE_TSHARK").unwrap_or_else(|_| "tshark".to_string())
}

/// The Python interpreter: `$UROCE_PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("UROCE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Checks that tshark can run; on failure reports a skip (or panics) and returns false.
pub fn have_tshark(test: &str) -> bool {
    match probe(&tshark(), &["-v"]) {
        Ok(()) => true,
        Err(e) => {
            skip(
                test,
                &format!("tshark is not usable ({e}); scripts/test installs it"),
            );
            false
        }
    }
}

/// Checks that python3 with scapy's RoCE module is there; else skip (or panic).
pub fn have_scapy(test: &str) -> bool {
    match probe(&python(), &["-c", "import scapy.contrib.roce"]) {
        Ok(()) => true,
        Err(e) => {
            skip(
                test,
                &format!("python3 with scapy is not usable ({e}); scripts/test installs it"),
            );
            false
        }
    }
}

/// The workspace root (two levels above this crate's manifest).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A file name in the temp directory, unique per process and call, removed on drop.
pub struct TempFile(PathBuf);

impl TempFile {
    /// A new unique path `uroce-<tag>-<pid>-<nanos>-<n>.<ext>` (the file is not created).
    pub fn new(tag: &str, ext: &str) -> TempFile {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!("uroce-{tag}-{}-{nanos}-{n}.{ext}", std::process::id());
        TempFile(std::env::temp_dir().join(name))
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

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

/// A small deterministic generator (SplitMix64), so that a failing seed reproduces
/// exactly, on every platform and forever.
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// 32 random bits.
    pub fn u32(&mut self) -> u32 {
        (self.u64() >> 32) as u32
    }

    /// A random value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.u64() % n
    }

    /// A random 24-bit value.
    pub fn u24(&mut self) -> u32 {
        self.u32() & 0x00ff_ffff
    }

    /// A random byte.
    pub fn u8(&mut self) -> u8 {
        self.u64() as u8
    }

    /// A random bool.
    pub fn bool(&mut self) -> bool {
        self.u64() & 1 == 1
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.u8()).collect()
    }
}

/// One packet built for a test: the header values it was emitted from and its bytes.
pub struct Sample {
    /// The headers (with an empty payload; see [`Sample::payload`]).
    pub repr: uroce_wire::PacketRepr<'static>,
    /// The payload.
    pub payload: Vec<u8>,
    /// The FETH of a FLUSH packet, which `PacketRepr` cannot represent.
    pub feth: Option<[u8; 4]>,
    /// BTH..pad followed by 4 zero ICRC bytes.
    pub roce: Vec<u8>,
}

/// Builds a packet of opcode `info` with random header values and a random payload of up
/// to `max_payload` bytes (opcodes with a fixed payload get exactly that). FLUSH, which
/// `PacketRepr` refuses, is laid out by hand: BTH, FETH, RETH (roce-spec.md §1.3, §1.5).
pub fn random_sample(rng: &mut Rng, info: &uroce_wire::OpcodeInfo, max_payload: usize) -> Sample {
    use uroce_wire::opcode::{HeaderSet, Operation};
    use uroce_wire::{aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, reth, xrceth};

    let is_cnp = info.operation == Operation::Cnp;
    let bth = bth::Repr {
        opcode: info.opcode,
        solicited: rng.bool(),
        mig_req: rng.bool(),
        pad_cnt: 0,
        pkey: rng.u32() as u16 | 0x8000,
        fecn: rng.bool(),
        becn: is_cnp || rng.bool(),
        dest_qp: rng.u24(),
        ack_req: rng.bool(),
        psn: uroce_wire::Psn::new(rng.u24()),
    };
    let h = info.headers;
    // A syndrome of one of the three defined classes: ACK 0x00, RNR NAK 0x20, NAK 0x60.
    let class = [0x00, 0x20, 0x60][rng.below(3) as usize];
    let syndrome = aeth::Syndrome::from_byte(class | (rng.u8() & 0x1f)).expect("defined class");
    let repr = uroce_wire::PacketRepr {
        xrceth: h
            .contains(HeaderSet::XRCETH)
            .then(|| xrceth::Repr { srqn: rng.u24() }),
        deth: h.contains(HeaderSet::DETH).then(|| deth::Repr {
            qkey: rng.u32(),
            src_qp: rng.u24(),
        }),
        reth: h.contains(HeaderSet::RETH).then(|| reth::Repr {
            va: rng.u64(),
            rkey: rng.u32(),
            dma_len: rng.u32(),
        }),
        aeth: h.contains(HeaderSet::AETH).then(|| aeth::Repr {
            syndrome,
            msn: rng.u24(),
        }),
        atomic_eth: h.contains(HeaderSet::ATOMIC_ETH).then(|| atomic_eth::Repr {
            va: rng.u64() & !7,
            rkey: rng.u32(),
            swap_add: rng.u64(),
            compare: rng.u64(),
        }),
        atomic_ack_eth: h
            .contains(HeaderSet::ATOMIC_ACK_ETH)
            .then(|| atomic_ack_eth::Repr { orig: rng.u64() }),
        immdt: h
            .contains(HeaderSet::IMMDT)
            .then(|| immdt::Repr { imm: rng.u32() }),
        ieth: h
            .contains(HeaderSet::IETH)
            .then(|| ieth::Repr { rkey: rng.u32() }),
        ..uroce_wire::PacketRepr::new(bth, &[])
    };
    let payload = match info.exact_payload {
        Some(n) if is_cnp => vec![0; n],
        Some(n) => rng.bytes(n),
        None if info.payload => {
            let len = rng.below(max_payload as u64 + 1) as usize;
            rng.bytes(len)
        }
        None => Vec::new(),
    };

    if h.contains(HeaderSet::FETH) {
        // FLUSH: BTH ‖ FETH (selectivity level bits 5:4, placement type bits 3:0) ‖ RETH.
        let feth = [0, 0, 0, (rng.u8() & 0x3f) | 0x11];
        let mut roce = vec![0u8; bth::LEN + 4 + reth::LEN + uroce_wire::ICRC_LEN];
        bth.emit(&mut bth::Header::new_unchecked(&mut roce[..bth::LEN]));
        roce[bth::LEN..bth::LEN + 4].copy_from_slice(&feth);
        let r = reth::Repr {
            va: rng.u64(),
            rkey: rng.u32(),
            dma_len: rng.u32(),
        };
        r.emit(&mut reth::Header::new_unchecked(
            &mut roce[bth::LEN + 4..bth::LEN + 4 + reth::LEN],
        ));
        return Sample {
            repr: uroce_wire::PacketRepr {
                reth: Some(r),
                ..repr
            },
            payload: Vec::new(),
            feth: Some(feth),
            roce,
        };
    }

    let full = uroce_wire::PacketRepr {
        payload: &payload,
        ..repr
    };
    let mut roce = vec![0u8; full.buffer_len()];
    let n = full
        .emit(&mut roce)
        .unwrap_or_else(|e| panic!("emit {:#04x}: {e}", info.opcode));
    assert_eq!(n, roce.len());
    Sample {
        repr,
        payload,
        feth: None,
        roce,
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
