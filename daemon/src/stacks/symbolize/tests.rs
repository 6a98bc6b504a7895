//! Tests of [`super`] (`symbolize.rs`).
use super::*;
use crate::stacks::unwind::tests::{
    ChildGuard, build_spin_fixture, detach, scratch_dir, seize_and_sample,
};
use crate::stacks::unwind::{UnwindEnd, Unwinder, frame_address};
use burstyd_common::addr::{Avma, Svma};

/// The leaf frame at `a`.
fn ip(a: u64) -> FrameAddress {
    FrameAddress::InstructionPointer(Avma(a))
}

/// A caller's frame, returning to `a`.
fn ra(a: u64) -> FrameAddress {
    FrameAddress::ReturnAddress(Avma(a))
}

impl Symbolizer {
    /// One frame, through [`Symbolizer::resolve_users`] (call
    /// [`ProcessTable::ensure`] first).
    fn resolve_user(&mut self, procs: &ProcessTable, pid: Pid, frame: FrameAddress) -> Resolved {
        self.resolve_users(procs, [(pid, frame)])
            .remove(&(pid, frame))
            .unwrap()
    }

    /// Resolves an SVMA in `module` directly (no process needed).
    fn resolve_svma(&mut self, module: &Arc<Module>, svma: u64) -> Vec<Frame> {
        self.module_symbols(module).resolve(svma).to_vec()
    }
}

#[inline(never)]
fn burstyd_symbolize_marker_fn(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x55
}

fn function_names(r: &Resolved) -> Vec<&str> {
    r.frames.iter().map(|f| f.function.as_str()).collect()
}

#[test]
fn symbolize_own_function() {
    let pid = Pid(std::process::id());
    let addr = burstyd_symbolize_marker_fn as fn(u64) -> u64 as usize as u64;
    assert_ne!(burstyd_symbolize_marker_fn(1), 0);
    let mut procs = ProcessTable::new();
    assert!(procs.ensure(pid, addr));
    let mut s = Symbolizer::new();
    let r = s.resolve_user(&procs, pid, ip(addr));
    let outer = r
        .frames
        .last()
        .unwrap_or_else(|| panic!("no frames: {r:?}"));
    assert!(
        outer.function.contains("burstyd_symbolize_marker_fn"),
        "{r:?}"
    );
    assert!(
        outer.function.contains("symbolize::tests"),
        "demangled path: {r:?}"
    );
    assert!(
        outer
            .file
            .as_deref()
            .is_some_and(|f| f.ends_with("symbolize/tests.rs")),
        "{r:?}"
    );
    assert!(outer.line.is_some());
    // As a return address (addr+1 → lookup addr) it is the same function.
    let r2 = s.resolve_user(&procs, pid, ra(addr + 1));
    assert_eq!(r2.frames.last().map(|f| &f.function), Some(&outer.function));
    // Cached: same answer again.
    assert_eq!(s.resolve_user(&procs, pid, ip(addr)).frames, r.frames);
    let m = r.mapping.unwrap();
    assert!(m.start <= addr && addr < m.limit);
    // The DWARF was read, and closed after the batch; a new address
    // opens it again.
    let dwarf_open = |s: &Symbolizer| s.modules.values().any(|m| matches!(m.dwarf, Some(Some(_))));
    assert!(!dwarf_open(&s));
    let r3 = s.resolve_user(&procs, pid, ip(addr + 2));
    assert_eq!(r3.frames.last().map(|f| &f.function), Some(&outer.function));
    assert!(!dwarf_open(&s));
}

#[test]
fn symbolize_libc_getpid() {
    let pid = Pid(std::process::id());
    let addr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"getpid".as_ptr()) } as u64;
    assert_ne!(addr, 0);
    let mut procs = ProcessTable::new();
    assert!(procs.ensure(pid, addr));
    let mut s = Symbolizer::new();
    let r = s.resolve_user(&procs, pid, ip(addr));
    assert!(
        r.frames
            .last()
            .is_some_and(|f| f.function.contains("getpid")),
        "{r:?}"
    );
    assert!(r.mapping.as_ref().unwrap().path.contains("libc.so"));
    // An address in the middle of getpid is still getpid.
    let r = s.resolve_user(&procs, pid, ip(addr + 2));
    assert!(
        function_names(&r).iter().any(|f| f.contains("getpid")),
        "{r:?}"
    );
}

#[test]
fn symbolize_unknown_and_garbage() {
    let mut procs = ProcessTable::new();
    let mut s = Symbolizer::new();
    let pid = Pid(std::process::id());
    procs.ensure(pid, 0);
    for addr in [0u64, 1, u64::MAX, 0x1000] {
        let r = s.resolve_user(&procs, pid, ra(addr));
        assert!(r.frames.is_empty() && r.mapping.is_none());
    }
    assert!(
        s.resolve_user(&procs, Pid(u32::MAX - 7), ip(0x401000))
            .frames
            .is_empty()
    );
    assert!(s.resolve_kernel(0).frames.is_empty());
}

#[test]
fn symbolize_vdso() {
    let pid = Pid(std::process::id());
    let mut procs = ProcessTable::new();
    procs.refresh(pid);
    let Some(vdso) = procs
        .exec_mappings(pid)
        .iter()
        .find(|m| &*m.path == "[vdso]")
        .cloned()
    else {
        return;
    };
    let mut s = Symbolizer::new();
    // Every address of the vdso resolves to something non-empty.
    let r = s.resolve_user(&procs, pid, ip(vdso.start + 0x10));
    assert!(!r.frames.is_empty(), "{r:?}");
    assert_eq!(r.mapping.unwrap().path, "[vdso]");
    // Its exported functions resolve by name.
    let obj = object::File::parse(vdso.module.data()).unwrap();
    let sym = obj
        .dynamic_symbols()
        .find(|s| s.name().is_ok_and(|n| n.ends_with("clock_gettime")) && s.address() != 0)
        .expect("vdso exports clock_gettime");
    let r = s.resolve_user(&procs, pid, ip((Svma(sym.address()) + vdso.bias).0 + 1));
    assert!(
        function_names(&r)
            .iter()
            .any(|n| n.ends_with("clock_gettime")),
        "{r:?}"
    );
}

#[test]
fn symbolize_kernel_kallsyms() {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let mut by_addr: HashMap<u64, Vec<String>> = HashMap::new();
    let mut candidates = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(a), Some(t), Some(n)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let a = u64::from_str_radix(a, 16).unwrap_or(0);
        by_addr.entry(a).or_default().push(n.to_owned());
        if matches!(t, "T" | "t")
            && [
                "do_sys_open",
                "__x64_sys_getpid",
                "__x64_sys_openat",
                "schedule",
            ]
            .contains(&n)
        {
            candidates.push((a, n.to_owned()));
        }
    }
    assert!(
        !candidates.is_empty(),
        "kallsyms has none of the known symbols"
    );
    assert!(
        candidates.iter().all(|c| c.0 != 0),
        "kallsyms addresses hidden (kptr_restrict); run as root"
    );
    let mut s = Symbolizer::new();
    let mut exact = 0;
    for (addr, name) in &candidates {
        let aliases = &by_addr[addr];
        for a in [*addr, addr + 1] {
            let r = s.resolve_kernel(a);
            let got = function_names(&r);
            assert_eq!(got.len(), 1, "{a:#x}: {r:?}");
            if aliases.len() == 1 {
                assert_eq!(got[0], name, "{a:#x}");
                exact += 1;
            } else {
                // Several names at one address: any of them is right.
                assert!(
                    aliases.iter().any(|n| n == got[0]),
                    "{a:#x}: {got:?} not in {aliases:?}"
                );
            }
            assert_eq!(r.mapping.as_ref().unwrap().path, "[kernel.kallsyms]");
        }
    }
    assert!(
        exact > 0,
        "no known symbol with a unique address: {candidates:?}"
    );
}

#[test]
fn symbolize_unwound_gcc_fixture() {
    let dir = scratch_dir("symbolize");
    let exe = build_spin_fixture(&dir);
    let child = ChildGuard(std::process::Command::new(&exe).spawn().unwrap());
    let pid = Pid(child.0.id());
    let mut procs = ProcessTable::new();
    let mut u = Unwinder::new();
    let mut s = Symbolizer::new();
    let mut out = Vec::new();
    let mut names = Vec::new();
    let mut end = UnwindEnd::Error;
    let mut leaf_frame = None;
    // Sample until the child is inside `leaf` (it gets there within milliseconds).
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (regs, stack) = seize_and_sample(pid, 16 << 10);
        end = u.unwind(&mut procs, pid, &regs, &stack, &mut out);
        detach(pid);
        names = out
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let r = s.resolve_user(&procs, pid, frame_address(i, a));
                if i == 0 {
                    leaf_frame = r.frames.last().cloned();
                }
                r.frames
                    .last()
                    .map(|f| f.function.clone())
                    .unwrap_or_else(|| "??".into())
            })
            .collect();
        if names.first().map(String::as_str) == Some("leaf") {
            break;
        }
    }
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(end, UnwindEnd::Complete, "{names:?}");
    assert_eq!(names[..4], ["leaf", "b", "a", "main"], "{names:?}");
    assert!(
        names[4..].iter().any(|n| n.contains("libc_start")),
        "{names:?}"
    );
    let leaf = leaf_frame.unwrap();
    assert!(
        leaf.file.as_deref().is_some_and(|f| f.ends_with("spin.c")),
        "{leaf:?}"
    );
    assert!(leaf.line.is_some());
}

#[test]
fn symbolize_demangles() {
    assert_eq!(demangle("_ZN3foo3barE"), "foo::bar");
    assert_eq!(demangle("_ZN3foo3bar17h0123456789abcdefE"), "foo::bar");
    assert_eq!(demangle("_RNvCs1234_3foo3bar"), "foo::bar");
    assert_eq!(
        demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
        "std::vector<int, std::allocator<int> >::push_back(int const&)"
    );
    assert_eq!(demangle("getpid"), "getpid");
}

#[test]
fn symbolize_separate_debug_file_via_debuglink() {
    let dir = scratch_dir("debuglink");
    let exe = build_spin_fixture(&dir);
    let dbg = dir.join("spin.debug");
    let run = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(args[0])
            .args(&args[1..])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "objcopy".as_ref(),
        "--only-keep-debug".as_ref(),
        exe.as_os_str(),
        dbg.as_os_str(),
    ]);
    run(&["strip".as_ref(), "--strip-debug".as_ref(), exe.as_os_str()]);
    let link = format!("--add-gnu-debuglink={}", dbg.display());
    run(&["objcopy".as_ref(), link.as_ref(), exe.as_os_str()]);
    let path = exe.to_str().unwrap();
    let module =
        Arc::new(Module::from_file(path, exe.clone(), std::fs::File::open(&exe).unwrap()).unwrap());
    assert!(!module.has_debug_info());
    assert_eq!(module.debug_file(), Some(dbg.clone()));
    let obj = object::File::parse(module.data()).unwrap();
    let leaf = obj
        .symbols()
        .find(|s| s.name() == Ok("leaf"))
        .expect("symtab has leaf")
        .address();
    let mut s = Symbolizer::new();
    let frames = s.resolve_svma(&module, leaf);
    let _ = std::fs::remove_dir_all(&dir);
    let f = frames.last().expect("frames");
    assert_eq!(f.function, "leaf");
    assert!(
        f.file.as_deref().is_some_and(|p| p.ends_with("spin.c")),
        "{frames:?}"
    );
    assert!(f.line.is_some());
}

/// A fully stripped program (no symbol, no DWARF): an address inside a
/// function is named by the function its unwind info places there, as
/// the bursts' plans name it and with its module (`spin!sub_1160`), the
/// same name at its entry and further in; an address of no function is
/// left to the caller.
#[test]
fn a_stripped_function_is_named_as_the_plans_name_it_with_its_module() {
    let dir = scratch_dir("stripped-names");
    let exe = build_spin_fixture(&dir);
    let leaf = {
        let bytes = std::fs::read(&exe).unwrap();
        let obj = object::File::parse(&*bytes).unwrap();
        let s = obj.symbols().find(|s| s.name() == Ok("leaf")).unwrap();
        (s.address(), s.size())
    };
    let out = std::process::Command::new("strip")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = exe.to_str().unwrap();
    let module =
        Arc::new(Module::from_file(path, exe.clone(), std::fs::File::open(&exe).unwrap()).unwrap());
    let obj = object::File::parse(module.data()).unwrap();
    assert!(obj.symbols().next().is_none(), "not stripped");
    // What the rewriter's plan calls it.
    let planned = userspace_rewriter::analysis::functions::discover(&obj, module.data())
        .unwrap()
        .into_iter()
        .find(|f| f.start == leaf.0)
        .expect("an FDE places leaf")
        .name;
    assert_eq!(planned, format!("sub_{:x}", leaf.0));
    let want = format!("spin!sub_{:x}", leaf.0);
    assert_eq!(function_name(path, &planned), want);
    let mut s = Symbolizer::new();
    for svma in [leaf.0, leaf.0 + leaf.1 / 2] {
        let frames = s.resolve_svma(&module, svma);
        let names: Vec<&str> = frames.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(names, [want.as_str()], "at {svma:#x}");
    }
    assert!(s.resolve_svma(&module, 1).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
    // Names that are not the discovery's own are only demangled.
    assert_eq!(function_name("/x/libfoo.so", "sub_total"), "sub_total");
    assert_eq!(function_name("/x/libfoo.so", "_ZN1a1bEv"), "a::b()");
}

#[test]
fn symbolizer_is_send() {
    fn is_send<T: Send>() {}
    is_send::<Symbolizer>();
    is_send::<ProcessTable>();
    is_send::<Unwinder>();
}
