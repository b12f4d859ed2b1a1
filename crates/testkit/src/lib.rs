//! Test infrastructure for uroce's own tests, and nothing else: it is a dev-dependency of
//! the crates whose integration tests use it, is never published, and no library or
//! binary of uroce may depend on it. Its helpers panic freely, as tests do.
//!
//! What it offers (all re-exported at the crate root):
//! * finding external tools and running them with a time limit ([`run`], [`probe`],
//!   [`have_tshark`], [`have_scapy`]), unique temporary files ([`TempFile`]), paths in the
//!   workspace ([`repo_root`]) and of the helper scripts in `scripts/` ([`script`]);
//! * tshark's decode of a capture file as rows of fields ([`tshark_fields`],
//!   [`tshark_decode`]) and the comparison of a decoded packet with uroce's headers
//!   ([`check_decoded`]);
//! * a deterministic generator ([`Rng`]) and random packets of any opcode
//!   ([`random_sample`]);
//! * a background capture on the loopback interface ([`LiveCapture`]).
//!
//! Policy: when a tool is missing the test prints a skip note and passes, unless the
//! environment sets `UROCE_REQUIRE_TOOLS=1` (as `scripts/test` does), in which case it
//! fails with a message saying what to install ([`skip`]).

mod capture;
mod packets;
mod tools;
mod tshark;

pub use capture::{LiveCapture, PROBE};
pub use packets::{hex, random_sample, Rng, Sample};
pub use tools::{
    have_scapy, have_tshark, probe, python, repo_root, run, run_in_new_netns, script, skip,
    tools_required, tshark, Output, TempFile,
};
pub use tshark::{
    check_decoded, num, tshark_decode, tshark_decodes_extension_headers, tshark_fields, Row,
    FRAME_FIELDS, IB_FIELDS, PAYLOAD_DISSECTORS, PI_WARN,
};
