//! `uroce devinfo`: the device, its port and GID table, and its counters, in the layout
//! of the verbs device-info tools. The device is opened for the report alone, so its
//! counters are zero; `uroce perf --counters` shows counters after traffic.

use std::io::Write;
use std::net::{IpAddr, Ipv6Addr};

use anyhow::Result;
use uroce_net::NetDevice;
use uroce_verbs::device::{AtomicCap, LinkLayer};
use uroce_verbs::{Gid, PortState};

/// The GUID as four dot-less groups of four hex digits (`0000:7fff:fe00:0001`).
pub fn guid_str(guid: u64) -> String {
    let b = guid.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// A GID as the verbs tools print it (eight groups of four hex digits), followed by the
/// usual IPv6 notation (IPv4-mapped for IPv4 addresses).
pub fn gid_str(gid: Gid) -> String {
    format!("{gid} ({})", Ipv6Addr::from(gid.0))
}

fn port_state(s: PortState) -> String {
    match s {
        PortState::Active => "PORT_ACTIVE (4)".into(),
        PortState::Down => "PORT_DOWN (1)".into(),
    }
}

/// Prints the description of `dev`; `verbose` adds every device and port attribute.
pub fn print(out: &mut impl Write, dev: &NetDevice, verbose: bool) -> Result<()> {
    let d = dev.device();
    let a = d.attr();
    let p = d.port_attr(1)?;
    writeln!(out, "hca_id:\t{}", d.name())?;
    writeln!(out, "\ttransport:\t\t\tInfiniBand (0)")?;
    writeln!(out, "\tfw_ver:\t\t\t\t{}", env!("CARGO_PKG_VERSION"))?;
    writeln!(out, "\tnode_guid:\t\t\t{}", guid_str(a.node_guid))?;
    writeln!(out, "\tsys_image_guid:\t\t\t{}", guid_str(a.sys_image_guid))?;
    writeln!(out, "\tvendor_id:\t\t\t0x0000")?;
    writeln!(out, "\tvendor_part_id:\t\t\t0")?;
    writeln!(out, "\thw_ver:\t\t\t\t0x0")?;
    writeln!(out, "\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt)?;
    writeln!(
        out,
        "\tnet_addr:\t\t\t{} (udp {})",
        dev.local_addr().ip(),
        dev.local_addr().port()
    )?;
    if verbose {
        let atomic = match a.atomic_cap {
            AtomicCap::None => "ATOMIC_NONE (0)",
            AtomicCap::Hca => "ATOMIC_HCA (1)",
            AtomicCap::Glob => "ATOMIC_GLOB (2)",
        };
        let rows: [(&str, String); 22] = [
            ("max_mr_size", format!("{:#x}", a.max_msg_sz)),
            ("max_qp", a.max_qp.to_string()),
            ("max_qp_wr", a.max_qp_wr.to_string()),
            ("max_sge", a.max_sge.to_string()),
            ("max_sge_rd", a.max_sge_rd.to_string()),
            ("max_inline_data", a.max_inline_data.to_string()),
            ("max_cq", a.max_cq.to_string()),
            ("max_cqe", a.max_cqe.to_string()),
            ("max_mr", a.max_mr.to_string()),
            ("max_pd", a.max_pd.to_string()),
            ("max_qp_rd_atom", a.max_qp_rd_atom.to_string()),
            ("max_qp_init_rd_atom", a.max_qp_init_rd_atom.to_string()),
            ("max_srq", a.max_srq.to_string()),
            ("max_srq_wr", a.max_srq_wr.to_string()),
            ("max_srq_sge", a.max_srq_sge.to_string()),
            ("max_ah", a.max_ah.to_string()),
            ("max_xrcd", a.max_xrcd.to_string()),
            ("max_pkeys", a.max_pkeys.to_string()),
            ("local_ca_ack_delay", a.local_ca_ack_delay.to_string()),
            ("atomic_cap", atomic.to_string()),
            ("max_msg_sz", format!("{:#x}", a.max_msg_sz)),
            ("link_mtu", d.link_mtu().to_string()),
        ];
        for (k, v) in rows {
            writeln!(out, "\t{k}:{}{v}", tabs(8, k.len() + 1))?;
        }
    }
    writeln!(out, "\t\tport:\t1")?;
    writeln!(out, "\t\t\tstate:\t\t\t{}", port_state(p.state))?;
    writeln!(
        out,
        "\t\t\tmax_mtu:\t\t{} ({})",
        p.max_mtu.bytes(),
        p.max_mtu.enum_value()
    )?;
    writeln!(
        out,
        "\t\t\tactive_mtu:\t\t{} ({})",
        p.active_mtu.bytes(),
        p.active_mtu.enum_value()
    )?;
    writeln!(out, "\t\t\tsm_lid:\t\t\t0")?;
    writeln!(out, "\t\t\tport_lid:\t\t0")?;
    writeln!(out, "\t\t\tport_lmc:\t\t0x00")?;
    let ll = match p.link_layer {
        LinkLayer::Ethernet => "Ethernet",
        LinkLayer::InfiniBand => "InfiniBand",
    };
    writeln!(out, "\t\t\tlink_layer:\t\t{ll}")?;
    if verbose {
        writeln!(out, "\t\t\tmax_msg_sz:\t\t{:#x}", p.max_msg_sz)?;
        writeln!(out, "\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len)?;
        writeln!(out, "\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len)?;
        writeln!(out, "\t\t\tP_Key[  0]:\t\t{:#06x}", d.pkey(1, 0)?)?;
    }
    // Populated GID entries (only entry 0 on a uroce device).
    for i in 0..p.gid_tbl_len.min(16) {
        let gid = d.gid(1, i)?;
        if i > 0 && gid.is_zero() {
            continue;
        }
        writeln!(out, "\t\t\tGID[{i:3}]:\t\t{}, RoCE v2", gid_str(gid))?;
    }
    // The device was opened just for this report: nothing has used it yet.
    writeln!(
        out,
        "\tcounters:\t\t\t(this device was just opened, so they are zero; \
         `uroce perf --counters` prints both sides' counters after each test)"
    )?;
    for (k, v) in dev.counters().fields() {
        writeln!(out, "\t\t{k}:{}{v}", tabs(16, k.len() + 1))?;
    }
    Ok(())
}

/// Column at which values start.
const VALUE_COLUMN: usize = 40;

/// Tabs that move from the end of a `len`-character key starting at column `start` to
/// [`VALUE_COLUMN`] (at least one).
fn tabs(start: usize, len: usize) -> String {
    let end = start + len;
    let n = if end >= VALUE_COLUMN {
        1
    } else {
        VALUE_COLUMN / 8 - end / 8
    };
    "\t".repeat(n)
}

/// Runs `uroce devinfo`.
pub fn devinfo_cmd(addr: Option<IpAddr>, verbose: bool) -> Result<()> {
    let addr = crate::perf::default_addr(addr)?;
    let dev = crate::perf::open_device(addr, None)?;
    let mut out = std::io::stdout().lock();
    print(&mut out, &dev, verbose)?;
    out.flush()?;
    dev.close()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_and_gid_formats() {
        assert_eq!(guid_str(0x0000_0aff_fe00_0001), "0000:0aff:fe00:0001");
        let g = Gid::from_ip("127.0.0.3".parse().unwrap());
        assert_eq!(
            gid_str(g),
            "0000:0000:0000:0000:0000:ffff:7f00:0003 (::ffff:127.0.0.3)"
        );
    }
}
