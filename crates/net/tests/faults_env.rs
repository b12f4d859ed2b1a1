//! `FaultConfig::from_env` and `SocketConfig::with_env_faults`. Alone in its test binary
//! (one test function) because it changes the process environment.

use uroce_net::faults::ENV_VAR;
use uroce_net::{FaultConfig, FaultParseError, SocketConfig, SocketError};

#[test]
fn reads_uroce_faults_from_the_environment() {
    assert_eq!(ENV_VAR, "UROCE_FAULTS");
    std::env::remove_var(ENV_VAR);
    assert_eq!(FaultConfig::from_env(), Ok(None));
    assert_eq!(
        SocketConfig::default().with_env_faults().unwrap().faults,
        None
    );

    std::env::set_var(ENV_VAR, "  ");
    assert_eq!(FaultConfig::from_env(), Ok(None));

    std::env::set_var(ENV_VAR, "drop=0.5,seed=3");
    let want = FaultConfig {
        drop: 0.5,
        seed: 3,
        ..FaultConfig::NONE
    };
    assert_eq!(FaultConfig::from_env(), Ok(Some(want)));
    assert_eq!(
        SocketConfig::default().with_env_faults().unwrap().faults,
        Some(want)
    );

    std::env::set_var(ENV_VAR, "drop=0.5,jitter=1");
    assert_eq!(
        FaultConfig::from_env(),
        Err(FaultParseError::UnknownKey {
            key: "jitter".into()
        })
    );
    assert!(matches!(
        SocketConfig::default().with_env_faults(),
        Err(SocketError::Faults(FaultParseError::UnknownKey { .. }))
    ));
    std::env::remove_var(ENV_VAR);
}
