//! The configuration at run time: SIGHUP reloads, and the rescans of
//! configured targets.

use super::intervals::{interval_timer, pusher_pending, start_pusher};
use super::scan::apply_scan;
use super::{ServiceParts, Session};
use crate::service::metrics::METRICS;
use crate::service::settings::Settings;
use crate::service::targets::Scanner;
use crate::stacks::table::ProcessTable;

impl Session {
    /// SIGHUP. The interval clock goes on: the same interval keeps its
    /// timer, a new one ends the current interval that long after it
    /// began (at once if that is past), so that reloads never delay an
    /// interval profile. The pending pushes start over only when the
    /// destinations (or the output directory, their spool) changed.
    pub(super) fn on_reload(&mut self) {
        let interval = self.opts.interval;
        let push = (
            self.opts.service.settings.push.clone(),
            self.opts.output.clone(),
        );
        // The burst records so far are counted under the old options.
        if self.bursts.active() {
            self.on_burst_tick();
        }
        self.reload();
        if self.opts.interval != interval {
            let now = std::time::SystemTime::now();
            let elapsed = now
                .duration_since(self.out.interval_start)
                .unwrap_or_default();
            self.timers.interval = self.opts.interval.map(|d| interval_timer(d, elapsed));
        }
        if (&self.opts.service.settings.push, &self.opts.output) != (&push.0, &push.1) {
            self.out.push_pending = pusher_pending(&self.svc.pusher, std::time::SystemTime::now());
        }
        // Targets dropped (or bursts turned off) are detached now, new
        // ones attached.
        self.select_bursts();
    }

    /// SIGHUP: re-reads the configuration; a bad file is rejected whole (with
    /// its line and reason) and the running settings stay.
    fn reload(&mut self) {
        let Session {
            opts,
            sampler,
            bursts,
            selection,
            svc:
                ServiceParts {
                    scanner,
                    http,
                    req_tx,
                    pusher,
                    notify,
                    ..
                },
            ..
        } = self;
        let Some(r) = &opts.service.reload else {
            tracing::info!("SIGHUP: no configuration file in use; nothing to reload");
            return;
        };
        let new = crate::service::config::load(&r.source)
            .map_err(anyhow::Error::from)
            .and_then(|f| Settings::resolve(f.as_ref(), Some(&r.source.path), &r.overrides));
        let new = match new {
            Ok(n) => n,
            Err(e) => {
                METRICS.config_reload_failures.inc();
                tracing::error!(
                    "configuration reload rejected, the previous configuration stays in force: {e:#}"
                );
                notify.status(&format!(
                    "configuration reload rejected (previous one in force): {e:#}"
                ));
                return;
            }
        };
        let old = opts.service.settings.clone();
        if new.event != old.event
            || new.sampling != old.sampling
            || new.kernel_stacks != old.kernel_stacks
        {
            tracing::warn!(
                "event, period/freq and kernel_stacks changes take effect at the next start (systemctl restart burstyd)"
            );
        }
        if new.bursts != old.bursts {
            let b = &new.bursts;
            if let Some(o) = bursts.options() {
                let o = b.options(o.full_trace, o.save_bursts.clone());
                bursts.set_options(o);
            }
            if let Some(sel) = selection.as_mut() {
                sel.set_max(b.max_traced);
            }
            tracing::info!(
                "bursts now: {} for targets, {} checks, at most {} processes at once{}{}",
                if b.enabled { "on" } else { "off" },
                b.burst,
                b.max_traced,
                if b.path_time { ", path time" } else { "" },
                match b.libraries {
                    crate::bursts::options::Libraries::All => ", all libraries",
                    crate::bursts::options::Libraries::Hot => ", hot libraries",
                    crate::bursts::options::Libraries::None => ", executables only",
                },
            );
        }
        if !r.static_targets
            && (new.targets != old.targets || new.bursts.enabled != old.bursts.enabled)
        {
            let was = scanner.is_some();
            let now_targeted = !new.targets.is_empty();
            if now_targeted {
                let s = scanner.get_or_insert_with(|| Scanner::new(Vec::new(), false));
                s.set_targets(new.targets.clone(), new.bursts.enabled);
                if !was && let Err(e) = sampler.set_targeted(true) {
                    tracing::error!("switching to targeted sampling: {e}");
                }
                apply_scan(s, sampler, &mut ProcessTable::new());
                let specs: Vec<_> = new.targets.iter().map(|t| t.spec.to_string()).collect();
                let pids: Vec<_> = s.current().iter().copied().collect();
                tracing::info!(
                    "targets now {}: {}",
                    specs.join(", "),
                    crate::service::targets::describe_pids(&pids)
                );
                crate::service::targets::warn_unmatchable(s.specs());
            } else if let Some(mut s) = scanner.take() {
                s.set_targets(Vec::new(), false);
                for pid in s.scan().removed {
                    let _ = sampler.remove_target(pid);
                }
                if let Err(e) = sampler.set_targeted(false) {
                    tracing::error!("switching to system-wide sampling: {e}");
                }
                METRICS.targets.set(0);
                tracing::info!("no targets configured: sampling every process");
            }
        }
        if new.output != old.output {
            opts.output = new.output.clone();
            if let Some(h) = http.as_ref() {
                h.set_output(new.output.clone());
            }
        }
        opts.interval = new.interval;
        if new.http != old.http {
            match &new.http {
                None => {
                    *http = None;
                    tracing::info!("HTTP endpoint off");
                }
                Some(listen) => {
                    // The old server, dropped once the new one runs,
                    // removes its Unix socket (another path than this).
                    match crate::service::http::Server::start(
                        listen,
                        req_tx.clone(),
                        opts.output.clone(),
                    ) {
                        Ok(s) => {
                            tracing::info!("HTTP endpoint now on {}", s.listen());
                            *http = Some(s);
                        }
                        Err(e) => {
                            tracing::error!(
                                "serving HTTP on {listen}: {e}; the endpoint stays as it was"
                            )
                        }
                    }
                }
            }
        }
        if new.push != old.push || new.output != old.output {
            // Dropping the old tasks leaves their spooled profiles on disk; the
            // new task of the same destination sends them.
            *pusher = None;
            *pusher = start_pusher(&new.push, &opts.output);
        }
        let path = r.source.path.display().to_string();
        opts.service.settings = new;
        METRICS.config_reloads.inc();
        tracing::info!("configuration reloaded from {path}");
        notify.status(&format!("configuration reloaded from {path}"));
    }
}
