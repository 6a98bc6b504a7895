//! The plan cache: the first attach to a program analyses and generates
//! its modules and stores them; the next attach to the same files moves
//! the cached clones to the new process's layout (no analysis, no
//! generation) and traces exactly as well: a full trace counts the same
//! paths. A damaged entry is ignored and replaced, never used.
use std::time::Duration;

use burstyd_tests::*;

/// `paths_known` under a full trace with the cache in `cache`: the run,
/// checked for identical output and exact path counts.
fn traced(scratch: &Scratch, cache: &std::path::Path, n: i64, untraced: &Finished) -> BurstydRun {
    let exe = fixture("paths_known");
    let arg = n.to_string();
    let run = burstyd_run(
        scratch,
        &[
            "--freq",
            "999",
            "--full-trace",
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        &[exe.to_str().unwrap(), &arg],
        Duration::from_secs(120),
    );
    run.assert_ok();
    assert_eq!(run.finished.stdout_str(), untraced.stdout_str());
    assert_paths_known_counts(&run, n);
    run
}

/// The "bursty tracing: ..." attach line.
fn attach_line(run: &BurstydRun) -> String {
    run.finished
        .stderr
        .lines()
        .find(|l| l.contains("bursty tracing: ") && l.contains("rewritten"))
        .unwrap_or_else(|| panic!("no attach line\n{}", run.finished.describe()))
        .to_owned()
}

#[test]
fn a_second_run_moves_the_cached_clones_and_counts_the_same_paths() {
    require_root();
    let n: i64 = 360_000;
    let exe = fixture("paths_known");
    let untraced = run_untraced(
        &[exe.to_str().unwrap(), &n.to_string()],
        Duration::from_secs(60),
    );
    let scratch = Scratch::new("plan-cache");
    let cache = scratch.join("cache");

    // First: analysed and generated, then stored (one entry per module).
    let first = traced(&scratch, &cache, n, &untraced);
    let line = attach_line(&first);
    assert!(!line.contains("plan cache"), "{line}");
    let entries = || -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "bin"))
            .collect();
        v.sort();
        v
    };
    let stored = entries();
    let modules = line
        .split(" in ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no module count in {line}"));
    assert_eq!(stored.len(), modules, "{stored:?}\n{line}");

    // Second: every module from the cache, the same exact counts.
    let second = traced(&scratch, &cache, n, &untraced);
    let line = attach_line(&second);
    assert!(
        line.contains(&format!(
            "({modules} of {modules} modules from the plan cache)"
        )),
        "{line}"
    );

    // A damaged entry is ignored (with a warning) and replaced.
    for p in &stored {
        let len = std::fs::metadata(p).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.set_len(len / 2).unwrap();
    }
    let third = traced(&scratch, &cache, n, &untraced);
    let line = attach_line(&third);
    assert!(!line.contains("plan cache"), "{line}");
    assert!(
        third.finished.stderr.contains("ignoring the cached plan"),
        "{}",
        third.finished.describe()
    );
    let fourth = traced(&scratch, &cache, n, &untraced);
    assert!(attach_line(&fourth).contains("modules from the plan cache"));

    // The daemon reads the CFGs of the functions with paths from the
    // entries when it exports them: entries removed meanwhile (the bound,
    // a cleanup) are still read through the files it keeps open.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let remover = {
        let (stop, cache) = (stop.clone(), cache.clone());
        std::thread::spawn(move || {
            let mut removed = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for e in std::fs::read_dir(&cache).into_iter().flatten().flatten() {
                    if e.path().extension().is_some_and(|x| x == "bin")
                        && std::fs::remove_file(e.path()).is_ok()
                    {
                        removed += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            removed
        })
    };
    let fifth = traced(&scratch, &cache, n, &untraced);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        remover.join().unwrap() >= modules,
        "{}",
        fifth.finished.describe()
    );
}

/// `--no-cache` neither reads nor writes it.
#[test]
fn no_cache_leaves_the_directory_alone() {
    require_root();
    let n: i64 = 12_000;
    let exe = fixture("paths_known");
    let scratch = Scratch::new("no-cache");
    let cache = scratch.join("cache");
    let run = burstyd_run(
        &scratch,
        &["--no-cache", "--cache-dir", cache.to_str().unwrap()],
        &[exe.to_str().unwrap(), &n.to_string()],
        Duration::from_secs(60),
    );
    run.assert_ok();
    assert!(!cache.exists(), "{}", run.finished.describe());
}

/// The cached clones run inside traced processes: a cache directory that
/// others may write is not used (said once), and nothing is read from it.
#[test]
fn a_cache_directory_others_may_write_is_not_used() {
    use std::os::unix::fs::PermissionsExt;
    require_root();
    let n: i64 = 12_000;
    let exe = fixture("paths_known");
    let scratch = Scratch::new("open-cache");
    let cache = scratch.join("cache");
    let run_once = || {
        let run = burstyd_run(
            &scratch,
            &["--cache-dir", cache.to_str().unwrap()],
            &[exe.to_str().unwrap(), &n.to_string()],
            Duration::from_secs(60),
        );
        run.assert_ok();
        run
    };
    run_once();
    assert!(std::fs::read_dir(&cache).unwrap().count() > 0);
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let run = run_once();
    assert!(
        run.finished.stderr.contains("the plan cache is not used")
            && run.finished.stderr.contains("writable by others"),
        "{}",
        run.finished.describe()
    );
    assert!(
        !attach_line(&run).contains("plan cache"),
        "{}",
        attach_line(&run)
    );
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(attach_line(&run_once()).contains("modules from the plan cache"));
}
