//! Libraries loaded and unloaded while a process is traced in bursts
//! (`dlopen`, `dlclose`): a library loaded after the attach is cloned and
//! traced, and the clones of a library that was unloaded are never
//! entered again, even when another library is mapped at its addresses.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use burstyd_tests::*;

/// libdlswap_a.so (K = 3) and libdlswap_b.so (K = 5) in `dir`.
fn build_libraries(dir: &Path) {
    let src = workspace_root().join("tests/fixtures/dlswap_lib.c");
    for (name, k) in [("a", "3"), ("b", "5")] {
        let out = Command::new("gcc")
            .args(["-O2", "-g", "-fPIC", "-shared", &format!("-DK={k}"), "-o"])
            .arg(dir.join(format!("libdlswap_{name}.so")))
            .arg(&src)
            .output()
            .expect("gcc");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// One traced run of `tests/fixtures/dlswap.c` and what it left.
struct Swapped {
    /// The program's stdout and stderr, and what it printed untraced.
    stdout: String,
    stderr: String,
    untraced: String,
    /// burstyd's log and output directory.
    log: String,
    out_dir: PathBuf,
}

/// `dlswap` with `n` and `rounds`, untraced, then under `burstyd --pid`
/// (2000 Hz): it runs libdlswap_a.so's `work` until burstyd has cloned
/// that library, then opens libdlswap_b.so and libdlswap_a.so in turn,
/// `rounds` times, closing each before opening the next. Asserts that
/// both ended well and that the libraries shared one address.
fn swap(name: &str, n: &str, rounds: &str) -> (Swapped, Scratch) {
    let exe = fixture("dlswap");
    let scratch = Scratch::new(name);
    let dir = scratch.join("libs");
    std::fs::create_dir_all(&dir).unwrap();
    build_libraries(&dir);
    let prog = |go: &Path| -> Vec<String> {
        [exe.as_path(), &dir, go]
            .iter()
            .map(|p| p.to_str().unwrap().to_owned())
            .chain([n.to_owned(), rounds.to_owned()])
            .collect()
    };
    let go_untraced = scratch.join("go-untraced");
    std::fs::write(&go_untraced, "").unwrap();
    let p = prog(&go_untraced);
    let untraced = run_untraced(
        &p.iter().map(String::as_str).collect::<Vec<_>>(),
        Duration::from_secs(120),
    );

    let go = scratch.join("go");
    let (out_path, err_path) = (scratch.join("stdout"), scratch.join("stderr"));
    let p = prog(&go);
    let mut target = Command::new(&p[0])
        .args(&p[1..])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let log_path = scratch.join("burstyd.log");
    let out_dir = scratch.join("out");
    let mut daemon = Command::new(burstyd_bin())
        .args(["--pid", &target.id().to_string(), "--freq", "2000", "-o"])
        .arg(&out_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    // The library is cloned (the attach's second step), then the program
    // goes on to the swaps.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !read(&log_path)
        .lines()
        .any(|l| l.contains("libdlswap_a.so") && l.contains("rewritten"))
    {
        assert!(
            Instant::now() < deadline && daemon.try_wait().unwrap().is_none(),
            "libdlswap_a.so was never cloned:\n{}",
            tail(&read(&log_path), 30)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(&go, "").unwrap();
    let status = target.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let dstatus = loop {
        if let Some(s) = daemon.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "burstyd did not end with its target"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let s = Swapped {
        stdout: read(&out_path),
        stderr: read(&err_path),
        untraced: untraced.stdout_str(),
        log: read(&log_path),
        out_dir,
    };
    assert!(
        status.success(),
        "dlswap failed: {status}\n{}\nburstyd:\n{}",
        s.stderr,
        tail(&s.log, 30)
    );
    assert!(
        dstatus.success(),
        "burstyd failed: {dstatus}\n{}",
        tail(&s.log, 30)
    );
    // Each library was mapped where the other had been.
    let bases: std::collections::BTreeSet<&str> = s
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("base "))
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(
        bases.len(),
        1,
        "the libraries did not share an address:\n{}",
        s.stderr
    );
    assert_eq!(
        s.stdout,
        s.untraced,
        "output differs\nburstyd:\n{}",
        tail(&s.log, 30)
    );
    (s, scratch)
}

/// A library opened after the attach (libdlswap_b.so, once
/// libdlswap_a.so was cloned and closed) is cloned in its turn: its
/// `work` has paths in `paths.pb.gz` and it gets its own BOLT profile.
#[test]
fn a_library_opened_after_attach_is_traced() {
    require_root();
    let _s = serial();
    let (s, _scratch) = swap("dlopen-late", "100000000", "1");
    assert!(
        s.log
            .lines()
            .any(|l| l.contains("(libdlswap_b.so) loaded since the attach rewritten")),
        "{}",
        tail(&s.log, 30)
    );
    let p = burstyd_tests::pprof::read_profile(&s.out_dir.join("paths.pb.gz"))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let in_b: i64 = p
        .samples
        .iter()
        .filter(|x| x.frames[0].mapping_file.ends_with("libdlswap_b.so"))
        .map(|x| x.values[0])
        .sum();
    assert!(
        in_b > 1000,
        "{in_b} path executions in libdlswap_b.so\n{}",
        tail(&s.log, 30)
    );
    let fdata = read(&s.out_dir.join("edges-libdlswap_b.so.fdata"));
    assert!(
        fdata.lines().any(|l| l.contains(" work ")),
        "no edges of work in edges-libdlswap_b.so.fdata:\n{fdata}"
    );
}

/// `tests/fixtures/dlswap.c` opens libdlswap_a.so and runs its `work`
/// until burstyd (`--pid`) has cloned the library, then closes it and
/// opens libdlswap_b.so and libdlswap_a.so in turn, 16 times, each mapped
/// where the other was (checked): the same instructions but for one
/// constant. A clone of libdlswap_a entered while libdlswap_b runs would
/// compute with the wrong constant. The program must print what it prints
/// untraced; burstyd must report the library unloaded and the loader's
/// link-map changes signalled to the handler.
#[test]
fn a_library_unloaded_mid_run_is_never_entered_again() {
    require_root();
    let _s = serial();
    let (s, _scratch) = swap("dlswap", "10000000", "16");
    assert!(
        s.log
            .contains("libdlswap_a.so was unloaded: its clones are no longer entered"),
        "{}",
        tail(&s.log, 30)
    );
    let summary = read_summary(&s.out_dir);
    let line = format!("{:#}", summary.json);
    // Each dlopen and dlclose calls the hook twice (before and after).
    assert!(summary.link_map_signalled() >= 2 * 16, "{line}");
    assert!(summary.traced().taken() > 0, "{line}");
}
