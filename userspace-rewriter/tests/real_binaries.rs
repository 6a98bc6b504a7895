//! Broad test: discover + disasm + cfg + liveness over every function of
//! real binaries on the machine, without panicking; prints coverage
//! (analysable/total non-PLT functions) and skip reasons. Set `SHOW_SKIPS=1`
//! to list every skipped function.

use userspace_rewriter::analysis::cfg;

fn run(path: &str) -> Option<(usize, usize)> {
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).unwrap();
    let t = std::time::Instant::now();
    let a = cfg::analyse(&file, &data).unwrap();
    // Liveness must work on every CFG.
    for (c, insns) in a.cfgs.iter().zip(&a.insns) {
        if let Ok(c) = c {
            assert_eq!(cfg::liveness(c, insns).len(), insns.len());
            let g = c.to_graph();
            assert_eq!(g.succs.len(), c.blocks.len());
        }
    }
    let (ok, total) = a.coverage();
    eprintln!(
        "{path}: {ok}/{total} analysable ({:.1}%), {} noreturn, skips {:?}, {:?}",
        100.0 * ok as f64 / total.max(1) as f64,
        a.noreturn.len(),
        a.skip_histogram(),
        t.elapsed()
    );
    if std::env::var_os("SHOW_SKIPS").is_some() {
        for (f, c) in a.functions.iter().zip(&a.cfgs) {
            if let Err(e) = c {
                eprintln!("  {} {:#x}: {e}", f.name, f.start);
            }
        }
    }
    Some((ok, total))
}

#[test]
fn ls_coverage_at_least_90_percent() {
    let (ok, total) = run("/bin/ls").expect("/bin/ls");
    assert!(total > 100, "{total}");
    assert!(ok * 10 >= total * 9, "{ok}/{total}");
}

#[test]
fn other_system_binaries_do_not_panic() {
    for p in [
        "/usr/bin/gzip",
        "/usr/bin/bzip2",
        "/usr/bin/bash",
        "/lib/x86_64-linux-gnu/libc.so.6",
    ] {
        if run(p).is_none() {
            eprintln!("{p}: not present");
        }
    }
}
