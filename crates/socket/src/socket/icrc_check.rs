//! Which received packets a socket accepts by their ICRC, and sealing / verifying a
//! packet's ICRC over the IP and UDP headers the kernel writes (see the socket module
//! docs and `docs/ICRC.md`).

use super::*;

/// Which received packets a socket accepts by their ICRC (see the module docs and
/// `docs/ICRC.md`). Whatever the policy, a packet whose ICRC matches the header for
/// IPv4 Identification 0 with DF (or the IPv6 header) is accepted at the cost of one CRC
/// (counted in `icrc_exact`); the policies differ in what they do on a mismatch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum IcrcPolicy {
    /// Only the uroce convention: an IPv4 ICRC must be valid for DF and an
    /// Identification below [`TRAIN_ID_SPAN`] (a GSO segment; `icrc_id_df`). Everything
    /// else is dropped (`bad_icrc`). `UROCE_ICRC=strict`.
    Strict,
    /// An IPv4 ICRC may be valid for any Identification, with DF set (`icrc_id_df`) or
    /// clear (`icrc_id_no_df`), as a Linux Soft-RoCE peer sends; anything else is dropped
    /// (`bad_icrc`). A corrupted packet passes with probability 2⁻¹⁵ instead of 2⁻³²
    /// (`docs/ICRC.md`). The default; `UROCE_ICRC=any-id`.
    #[default]
    AnyIdentification,
    /// As [`IcrcPolicy::AnyIdentification`], and an IPv4 packet whose ICRC is valid for
    /// no header is accepted anyway (`unverified_icrc`), protected only by the UDP
    /// checksum; IPv6 packets with a bad ICRC are still dropped.
    /// `UROCE_ICRC=unverified`.
    AcceptUnverified,
}

/// The environment variable [`IcrcPolicy::from_env`] reads.
pub const ICRC_ENV: &str = "UROCE_ICRC";

impl IcrcPolicy {
    /// Parses `strict`, `any-id` or `unverified` (surrounding blanks and case ignored).
    ///
    /// # Errors
    /// [`SocketError::BadIcrcPolicy`] for anything else.
    pub fn parse(value: &str) -> Result<IcrcPolicy, SocketError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "strict" => Ok(IcrcPolicy::Strict),
            "any-id" => Ok(IcrcPolicy::AnyIdentification),
            "unverified" => Ok(IcrcPolicy::AcceptUnverified),
            _ => Err(SocketError::BadIcrcPolicy {
                value: value.to_owned(),
            }),
        }
    }

    /// The policy in `UROCE_ICRC`: `None` when it is unset or blank.
    ///
    /// # Errors
    /// [`SocketError::BadIcrcPolicy`] if it is set to something else than the three names.
    pub fn from_env() -> Result<Option<IcrcPolicy>, SocketError> {
        match std::env::var(ICRC_ENV) {
            Ok(v) if !v.trim().is_empty() => IcrcPolicy::parse(&v).map(Some),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => Err(SocketError::BadIcrcPolicy {
                value: v.to_string_lossy().into_owned(),
            }),
        }
    }

    /// The name `UROCE_ICRC` takes for it.
    pub fn name(self) -> &'static str {
        match self {
            IcrcPolicy::Strict => "strict",
            IcrcPolicy::AnyIdentification => "any-id",
            IcrcPolicy::AcceptUnverified => "unverified",
        }
    }

    /// Whether a packet whose ICRC is valid for `ident` (not the uroce header) is
    /// accepted.
    pub(super) fn accepts(self, ident: Ipv4Ident) -> bool {
        match self {
            IcrcPolicy::Strict => ident.dont_fragment && ident.identification < TRAIN_ID_SPAN,
            IcrcPolicy::AnyIdentification | IcrcPolicy::AcceptUnverified => true,
        }
    }
}

/// The result of checking a received packet's ICRC against the headers an
/// [`IcrcPolicy`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IcrcCheck {
    /// The ICRC matches an accepted header (IPv4: the Identification and DF flag are
    /// reported with it; IPv6: the one header).
    Ok,
    /// It does not: the packet was corrupted, or (IPv4 only) its sender's kernel used a
    /// header the policy does not accept.
    Mismatch,
    /// No ICRC could be computed: the packet is shorter than a BTH and an ICRC, too long
    /// for a datagram, or the addresses are unusable (mixed families, unspecified,
    /// IPv4-mapped).
    Unverifiable,
}

/// Builds the IP + UDP headers of a datagram `src` → `dst` carrying `roce_len` bytes,
/// as Linux emits them for a uroce socket, with IPv4 Identification `id` (0 for a single
/// datagram, k for the k-th segment of a GSO message; ignored for IPv6); returns the IP
/// header length.
pub(super) fn kernel_headers(
    src: SocketAddr,
    dst: SocketAddr,
    roce_len: usize,
    id: u16,
    out: &mut [u8; MAX_HEADERS_LEN],
) -> Result<usize, WireError> {
    let ep = Endpoints {
        src: src.ip(),
        dst: dst.ip(),
        src_port: src.port(),
        dst_port: dst.port(),
    };
    let fields = IpFields {
        identification: id,
        ..IpFields::LINUX_UDP_SOCKET
    };
    let (ip_len, _) = ip::roce_headers_with(&ep, &fields, roce_len, out)?;
    Ok(ip_len)
}

/// Seals `roce` for the datagram `local` → `dst` with IPv4 Identification `id`, after
/// the addresses were checked.
pub(super) fn seal_checked(
    local: SocketAddr,
    dst: SocketAddr,
    roce: &mut [u8],
    id: u16,
) -> Result<u32, SocketError> {
    let seal_err = |source| SocketError::Seal {
        local,
        remote: dst,
        source,
    };
    let mut headers = [0u8; MAX_HEADERS_LEN];
    let ip_len = kernel_headers(local, dst, roce.len(), id, &mut headers).map_err(seal_err)?;
    let (ip_header, rest) = headers.split_at(ip_len);
    let udp_header = rest.get(..UDP_HEADER_LEN).unwrap_or_default();
    icrc::seal(ip_header, udp_header, roce).map_err(seal_err)
}

/// Refuses a pair of addresses for which no ICRC can be computed.
pub(super) fn check_pair(local: SocketAddr, dst: SocketAddr) -> Result<(), SocketError> {
    check_addr(local.ip())?;
    check_addr(dst.ip())?;
    if local.is_ipv4() != dst.is_ipv4() {
        return Err(SocketError::AddressFamily { local, remote: dst });
    }
    Ok(())
}

/// Seals the ICRC of `roce` (BTH..pad followed by 4 ICRC bytes, whose value is ignored)
/// for the datagram a uroce socket bound to `local` sends to `dst`: IPv4 with
/// Identification 0 and DF, or IPv6, with the real addresses and ports (IBA Annex A17,
/// RoCEv2; `docs/ICRC.md`). Returns the ICRC.
///
/// # Errors
/// [`SocketError::UnusableAddress`] for an unspecified or IPv4-mapped address,
/// [`SocketError::AddressFamily`] for mixed families, [`SocketError::Seal`] if `roce` is
/// shorter than a BTH and an ICRC or too long for one datagram.
pub fn seal_for(local: SocketAddr, dst: SocketAddr, roce: &mut [u8]) -> Result<u32, SocketError> {
    check_pair(local, dst)?;
    seal_checked(local, dst, roce, 0)
}

/// Checks the ICRC of `roce` (BTH..ICRC) received from `src` by a socket bound to
/// `local`, against the headers the uroce convention allows ([`IcrcPolicy::Strict`]: DF
/// and an IPv4 Identification below [`TRAIN_ID_SPAN`]).
pub fn verify_icrc(src: SocketAddr, local: SocketAddr, roce: &[u8]) -> IcrcCheck {
    verify_icrc_with(IcrcPolicy::Strict, src, local, roce).0
}

/// Checks the ICRC of `roce` (BTH..ICRC) received from `src` by a socket bound to
/// `local` as a socket with `policy` does: [`IcrcCheck::Ok`] when it is valid for a
/// header the policy accepts (for [`IcrcPolicy::AcceptUnverified`], the headers of
/// [`IcrcPolicy::AnyIdentification`]), with that header's IPv4 Identification and DF
/// flag (`None` for IPv6).
pub fn verify_icrc_with(
    policy: IcrcPolicy,
    src: SocketAddr,
    local: SocketAddr,
    roce: &[u8],
) -> (IcrcCheck, Option<Ipv4Ident>) {
    let (check, ident) = check_icrc(src, local, roce, 0, &mut IdentSolver::new());
    match (check, ident) {
        (IcrcCheck::Ok, Some(found)) if found != Ipv4Ident::UROCE && !policy.accepts(found) => {
            (IcrcCheck::Mismatch, None)
        }
        other => other,
    }
}

/// For a packet whose ICRC verifies ([`verify_icrc`] gives [`IcrcCheck::Ok`]), the IPv4
/// Identification of the header it was sealed for: 0 for a single datagram, k for the
/// k-th segment of a GSO message. `None` for IPv6 and for a packet that does not verify.
pub fn verified_identification(src: SocketAddr, local: SocketAddr, roce: &[u8]) -> Option<u16> {
    match verify_icrc_with(IcrcPolicy::Strict, src, local, roce) {
        (IcrcCheck::Ok, Some(ident)) => Some(ident.identification),
        _ => None,
    }
}

/// Checks the ICRC of `roce` against every header: the fast path for the header with
/// Identification `expected` and DF (one CRC; 0 for a single datagram, k for the k-th
/// packet of a coalesced one, which is what a uroce sender's GSO segment carries), then,
/// for IPv4, the header found by elimination (`uroce_wire::icrc_ident`). Returns
/// [`IcrcCheck::Ok`] with the IPv4 header found (`None` for IPv6), whatever it is: the
/// caller applies the policy. The answer does not depend on `expected` (at most one
/// header makes an ICRC valid, see `uroce_wire::icrc_ident`); only its cost does.
pub(super) fn check_icrc(
    src: SocketAddr,
    local: SocketAddr,
    roce: &[u8],
    expected: u16,
    solver: &mut IdentSolver,
) -> (IcrcCheck, Option<Ipv4Ident>) {
    if check_pair(src, local).is_err() || roce.len() < MIN_PACKET_LEN {
        return (IcrcCheck::Unverifiable, None);
    }
    let v4 = src.is_ipv4();
    let reference = Ipv4Ident {
        identification: if v4 { expected } else { 0 },
        dont_fragment: true,
    };
    let mut headers = [0u8; MAX_HEADERS_LEN];
    let Ok(ip_len) = kernel_headers(
        src,
        local,
        roce.len(),
        reference.identification,
        &mut headers,
    ) else {
        return (IcrcCheck::Unverifiable, None);
    };
    let (ip_header, rest) = headers.split_at(ip_len);
    let udp_header = rest.get(..UDP_HEADER_LEN).unwrap_or_default();
    let Some((body, trailer)) = roce.split_at_checked(roce.len() - ICRC_LEN) else {
        return (IcrcCheck::Unverifiable, None);
    };
    let (Ok(computed), Ok(on_wire)) = (
        icrc::compute(ip_header, udp_header, body),
        <[u8; ICRC_LEN]>::try_from(trailer),
    ) else {
        return (IcrcCheck::Unverifiable, None);
    };
    let on_wire = u32::from_le_bytes(on_wire);
    if computed == on_wire {
        return (IcrcCheck::Ok, v4.then_some(reference));
    }
    if v4 {
        let syndrome = computed ^ on_wire;
        let found = if reference == Ipv4Ident::UROCE {
            solver.solve(roce.len(), syndrome)
        } else {
            solver.basis(roce.len()).solve_from(reference, syndrome)
        };
        if let Some(ident) = found {
            return (IcrcCheck::Ok, Some(ident));
        }
    }
    (IcrcCheck::Mismatch, None)
}
