//! Running as a service: the configuration file and its command-line
//! overrides ([`config`]), configured targets matched over /proc
//! ([`targets`]), the HTTP endpoint ([`http`]), pushing profiles to
//! Pyroscope or Parca ([`push`]), the daemon's counters ([`metrics`]) and
//! systemd notifications ([`notify`]).
pub(crate) mod config;
pub(crate) mod http;
pub(crate) mod metrics;
pub(crate) mod notify;
pub(crate) mod push;
pub(crate) mod settings;
pub(crate) mod targets;
