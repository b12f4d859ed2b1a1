//! `IcrcPolicy::from_env`, `SocketConfig::with_env_icrc` and `NetConfig::from_env` read
//! `UROCE_ICRC`. Alone in its test binary (one test function) because it changes the
//! process environment.

use uroce_net::{IcrcPolicy, NetConfig, NetError, SocketConfig, SocketError, ICRC_ENV};

#[test]
fn reads_uroce_icrc_from_the_environment() {
    assert_eq!(ICRC_ENV, "UROCE_ICRC");
    std::env::remove_var(ICRC_ENV);
    assert_eq!(IcrcPolicy::from_env().unwrap(), None);
    assert_eq!(
        SocketConfig::default().icrc_policy,
        IcrcPolicy::AnyIdentification
    );
    assert_eq!(
        NetConfig::from_env().unwrap().icrc,
        IcrcPolicy::AnyIdentification
    );

    for (value, want) in [
        ("strict", IcrcPolicy::Strict),
        (" Any-ID ", IcrcPolicy::AnyIdentification),
        ("unverified", IcrcPolicy::AcceptUnverified),
    ] {
        std::env::set_var(ICRC_ENV, value);
        assert_eq!(IcrcPolicy::from_env().unwrap(), Some(want), "{value:?}");
        assert_eq!(IcrcPolicy::parse(want.name()).unwrap(), want);
        let socket = SocketConfig::default().with_env_icrc().unwrap();
        assert_eq!(socket.icrc_policy, want, "{value:?}");
        assert_eq!(NetConfig::from_env().unwrap().icrc, want, "{value:?}");
        assert_eq!(NetConfig::new([127, 0, 0, 1].into()).icrc, want);
    }

    std::env::set_var(ICRC_ENV, "  ");
    assert_eq!(IcrcPolicy::from_env().unwrap(), None);

    std::env::set_var(ICRC_ENV, "lenient");
    assert!(matches!(
        IcrcPolicy::from_env(),
        Err(SocketError::BadIcrcPolicy { value }) if value == "lenient"
    ));
    assert!(SocketConfig::default().with_env_icrc().is_err());
    assert!(matches!(
        NetConfig::from_env(),
        Err(NetError::Socket(SocketError::BadIcrcPolicy { .. }))
    ));
    // The unchecked constructor falls back to the default.
    assert_eq!(
        NetConfig::new([127, 0, 0, 1].into()).icrc,
        IcrcPolicy::AnyIdentification
    );
    std::env::remove_var(ICRC_ENV);
}
