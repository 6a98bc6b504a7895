//! Libraries loaded and unloaded while a process is traced in bursts
//! (`dlopen`, `dlclose`): the clones of a library that was unloaded are
//! never entered again, even when another library is mapped at its
//! addresses.
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use burstyd_tests::*;

/// Iterations of `work` per call, and rounds of dlopen/dlclose.
const N: &str = "40000000";
const ROUNDS: &str = "16";

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
    let exe = fixture("dlswap");
    let scratch = Scratch::new("dlswap");
    let dir = scratch.join("libs");
    std::fs::create_dir_all(&dir).unwrap();
    build_libraries(&dir);
    let dir_s = dir.to_str().unwrap();

    let go_untraced = scratch.join("go-untraced");
    std::fs::write(&go_untraced, "").unwrap();
    let prog = |go: &Path| {
        vec![
            exe.to_str().unwrap().to_owned(),
            dir_s.to_owned(),
            go.to_str().unwrap().to_owned(),
            N.to_owned(),
            ROUNDS.to_owned(),
        ]
    };
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
        .any(|l| l.contains("librar") && l.contains("libdlswap_a.so") && l.contains("rewritten"))
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
    let log = read(&log_path);
    let (stdout, stderr) = (read(&out_path), read(&err_path));
    assert!(
        status.success(),
        "dlswap failed: {status}\n{stderr}\nburstyd:\n{}",
        tail(&log, 30)
    );
    assert!(
        dstatus.success(),
        "burstyd failed: {dstatus}\n{}",
        tail(&log, 30)
    );
    // Each library was mapped where the other had been.
    let bases: std::collections::BTreeSet<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("base "))
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(
        bases.len(),
        1,
        "the libraries did not share an address:\n{stderr}"
    );
    assert_eq!(
        stdout,
        untraced.stdout_str(),
        "output differs\nburstyd:\n{}",
        tail(&log, 30)
    );
    assert!(
        log.contains("libdlswap_a.so was unloaded: its clones are no longer entered"),
        "{}",
        tail(&log, 30)
    );
    let line = bursts_line(&log);
    // Each dlopen and dlclose calls the hook twice (before and after).
    assert!(stat(&line, "signalled") >= 2 * 16, "{line}");
    assert!(stat(&line, "taken") > 0, "{line}");
}
