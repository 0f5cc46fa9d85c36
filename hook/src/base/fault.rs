//! Failures made on purpose, for the tests that check that the host's calls still reach ggml
//! when our own code fails: `GGML_VIZ_FAULT=resolve` makes the resolver panic whenever it is
//! asked where a call goes. Not a setting (the configuration does not know it); read once.

use std::sync::OnceLock;

/// Where a fault can be made.
#[derive(Clone, Copy)]
pub enum Fault {
    /// Finding the real function behind a wrapper.
    Resolve,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Resolve => "resolve",
        }
    }
}

/// Panics when `GGML_VIZ_FAULT` names `fault`.
pub fn inject(fault: Fault) {
    static SET: OnceLock<Option<String>> = OnceLock::new();
    if SET
        .get_or_init(|| std::env::var("GGML_VIZ_FAULT").ok())
        .as_deref()
        == Some(fault.name())
    {
        panic!("GGML_VIZ_FAULT={}", fault.name());
    }
}
