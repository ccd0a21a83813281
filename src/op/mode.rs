//! [`CheckMode`]: when a device call's agreement happens. A parameter of
//! `set_check_mode`, so it sits with the op list (the agreement module
//! carries the modes out).

use crate::parse::{choice, Choice};

/// When device calls agree on their descriptors (`RANKMESH_CHECK`, or
/// [`GroupCoordinator::set_check_mode`](crate::GroupCoordinator::set_check_mode)).
/// Host calls always agree before they move data (on shared memory the
/// agreement rides on the data exchange and costs nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckMode {
    /// Agree (one host all-reduce) before enqueuing: the CPU of every
    /// member waits for the slowest member at every device call.
    Strict,
    /// Post the agreement and enqueue at once; a disagreement is an error
    /// at the next synchronization point (module docs). The default.
    Deferred,
    /// No agreement: a mismatched call is not detected, and hangs until
    /// `RANKMESH_TIMEOUT` turns it into an error. Point-to-point calls keep
    /// their handshake in every mode.
    Off,
}

impl CheckMode {
    /// The name, as `RANKMESH_CHECK` takes it.
    pub fn name(self) -> &'static str {
        match self {
            CheckMode::Strict => "strict",
            CheckMode::Deferred => "deferred",
            CheckMode::Off => "off",
        }
    }

    pub(crate) fn code(self) -> u64 {
        self as u64
    }

    pub(crate) fn from_code(code: i64) -> Option<CheckMode> {
        <CheckMode as Choice>::ALL
            .iter()
            .copied()
            .find(|m| m.code() as i64 == code)
    }
}

choice!(
    CheckMode,
    &[CheckMode::Strict, CheckMode::Deferred, CheckMode::Off]
);

impl std::str::FromStr for CheckMode {
    type Err = String;
    fn from_str(s: &str) -> Result<CheckMode, String> {
        CheckMode::named(s.trim()).ok_or_else(|| "expected strict, deferred or off".into())
    }
}
