//! Interval profiles: what every profile says about how it was taken
//! ([`Meta`]), writing one (`context-<time>.pb.gz`, then retention), and
//! handing it to the push destinations.
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;

use super::files;
use super::options::SessionOptions;
use crate::export::context::{ProfileMeta, build_profile};
use crate::export::pprof::encode_gzip;
use crate::sampling::events::Sampling;
use crate::service::metrics::METRICS;
use crate::service::push::{Family, Job, Pusher};
use crate::service::settings::PushTarget;
use crate::stacks::cct::Cct;
use crate::stacks::symbolize::Symbolizer;
use crate::stacks::table::ProcessTable;

/// What every profile of the session says about how it was taken; each
/// profile adds its time span.
pub(super) struct Meta(ProfileMeta);

impl Meta {
    pub(super) fn new(opts: &SessionOptions, start: SystemTime) -> Self {
        Meta(ProfileMeta {
            event: opts.event.name.clone(),
            requested_event: opts.requested_event.clone(),
            period: match opts.sampling {
                Sampling::Period(p) => p,
                Sampling::Frequency(_) => 0,
            },
            freq: match opts.sampling {
                Sampling::Frequency(f) => f,
                Sampling::Period(_) => 0,
            },
            start,
            end: start,
        })
    }

    /// The metadata of a profile of `[start, end]`.
    pub(super) fn span(&self, start: SystemTime, end: SystemTime) -> ProfileMeta {
        ProfileMeta {
            start,
            end,
            ..self.0.clone()
        }
    }
}

/// A timer ticking every `d`, first when an interval that began
/// `elapsed` ago has lasted `d` (at once if it has).
pub(super) fn interval_timer(d: Duration, elapsed: Duration) -> tokio::time::Interval {
    let first = tokio::time::Instant::now() + d.saturating_sub(elapsed);
    let mut i = tokio::time::interval_at(first, d);
    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    i
}

pub(super) fn start_pusher(targets: &[PushTarget], output: &Path) -> Option<Pusher> {
    (!targets.is_empty()).then(|| {
        for t in targets {
            tracing::info!(
                "pushing profiles to {:?} at {} as {} every {:?}",
                t.kind,
                t.url,
                t.app,
                t.interval
            );
        }
        Pusher::start(targets, &output.join("spool"))
    })
}

/// Per push target, the trees not pushed yet (targets whose interval is
/// longer than the profile interval) and when they start.
pub(super) fn pusher_pending(p: &Option<Pusher>, start: SystemTime) -> Vec<(Cct, SystemTime)> {
    p.as_ref()
        .map(|p| p.targets().map(|_| (Cct::new(), start)).collect())
        .unwrap_or_default()
}

/// An interval profile, encoded, and whether its file was written.
pub(super) struct IntervalProfile {
    pub(super) bytes: Vec<u8>,
    pub(super) written: bool,
}

/// Writes one interval profile (and prunes old ones); returns its bytes.
/// A file that cannot be written (a full disk, EIO, a read-only file
/// system) is reported and the session goes on: the trees stay in memory,
/// in the session total that becomes `context.pb.gz`, and the profile
/// still goes to the push destinations and `/debug/pprof/context`.
pub(super) fn write_interval(
    opts: &SessionOptions,
    cct: &Cct,
    procs: &ProcessTable,
    symbolizer: &mut Symbolizer,
    meta: &ProfileMeta,
    notify: Option<&crate::service::notify::Notifier>,
) -> anyhow::Result<IntervalProfile> {
    let name = format!("context-{}.pb.gz", files::timestamp(meta.end));
    let profile = build_profile(cct, procs, symbolizer, meta);
    let bytes = encode_gzip(&profile).context("encoding an interval profile")?;
    let path = match crate::export::write_atomic(&opts.output, &name, &bytes) {
        Ok(path) => path,
        Err(e) => {
            tracing::warn!(
                "cannot write the interval profile {}: {e}; its {} samples stay in memory for the final context.pb.gz",
                opts.output.join(&name).display(),
                cct.samples
            );
            return Ok(IntervalProfile {
                bytes,
                written: false,
            });
        }
    };
    tracing::info!("wrote {} ({} samples)", path.display(), cct.samples);
    if let Some(n) = notify {
        n.status(&format!(
            "wrote {} ({} samples)",
            path.display(),
            cct.samples
        ));
    }
    METRICS.profiles_written.inc();
    let s = &opts.service.settings;
    if s.keep.is_some() || s.max_age.is_some() {
        files::prune_output(&opts.output, s.keep, s.max_age);
    }
    Ok(IntervalProfile {
        bytes,
        written: true,
    })
}

/// Hands an interval profile to each push target: as is when the target's
/// interval is the profile interval, else merged until its interval is
/// covered. `last`: the session ends, push whatever is pending.
#[allow(clippy::too_many_arguments)]
pub(super) fn push_interval(
    pusher: &Pusher,
    pending: &mut [(Cct, SystemTime)],
    cct: &Cct,
    bytes: &[u8],
    start: SystemTime,
    end: SystemTime,
    profile_interval: Option<Duration>,
    procs: &ProcessTable,
    symbolizer: &mut Symbolizer,
    meta: &Meta,
    last: bool,
) {
    let m = meta.span(start, end);
    let unix = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    };
    let job = |from: SystemTime, profile: Vec<u8>| Job {
        from: unix(from),
        until: unix(end).max(unix(from) + 1),
        rate_hz: m.freq,
        event: m.event.clone(),
        family: Family::Contexts,
        profile,
    };
    let iv = profile_interval.unwrap_or_default();
    for (i, t) in pusher.targets().enumerate() {
        let Some((acc, acc_start)) = pending.get_mut(i) else {
            continue;
        };
        if t.interval.as_secs_f64() <= iv.as_secs_f64() * 1.05 && acc.is_empty() {
            pusher.submit(i, job(start, bytes.to_vec()));
            *acc_start = end;
            continue;
        }
        if acc.is_empty() {
            *acc_start = start;
        }
        acc.merge(cct);
        let covered = end.duration_since(*acc_start).unwrap_or_default();
        if last || covered.as_secs_f64() >= t.interval.as_secs_f64() * 0.95 {
            let p = build_profile(acc, procs, symbolizer, &meta.span(*acc_start, end));
            match encode_gzip(&p) {
                Ok(b) => pusher.submit(i, job(*acc_start, b)),
                Err(e) => tracing::warn!("encoding a profile to push: {e}"),
            }
            *acc = Cct::new();
            *acc_start = end;
        }
    }
}

/// Hands an interval's path profile to every push destination, as its
/// own profile (`APP.paths`); each interval's as it comes, whatever the
/// destination's interval (path profiles do not merge as trees do).
pub(super) fn push_paths(
    pusher: &Pusher,
    bytes: &[u8],
    start: SystemTime,
    end: SystemTime,
    meta: &Meta,
) {
    push_own(pusher, bytes, start, end, meta, Family::Paths);
}

/// Hands an interval's hot data streams (pprof, see
/// [`crate::export::streams`]) to every push destination, as `APP.streams`,
/// each interval's as it comes (streams do not merge either).
pub(super) fn push_streams(
    pusher: &Pusher,
    bytes: &[u8],
    start: SystemTime,
    end: SystemTime,
    meta: &Meta,
) {
    push_own(pusher, bytes, start, end, meta, Family::Streams);
}

/// Hands an interval's profile of `family` (not a context profile) to
/// every push destination, as its own profile (`APP.paths`,
/// `APP.values`, ...), each interval's as it comes.
pub(super) fn push_own(
    pusher: &Pusher,
    bytes: &[u8],
    start: SystemTime,
    end: SystemTime,
    meta: &Meta,
    family: Family,
) {
    let unix = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    };
    for (i, _) in pusher.targets().enumerate() {
        pusher.submit(
            i,
            Job {
                from: unix(start),
                until: unix(end).max(unix(start) + 1),
                rate_hz: meta.0.freq,
                event: meta.0.event.clone(),
                family,
                profile: bytes.to_vec(),
            },
        );
    }
}

/// Adds `from`'s trees into `into`.
pub(super) fn merge(into: &mut Cct, from: Cct) {
    if into.threads.is_empty() {
        *into = from;
    } else {
        into.merge(&from);
    }
}
