//! Arbitrary bytes through ELF loading and the whole analysis: `ElfInfo`
//! (build ID, PT_LOAD segments), then `plan::analyze` (function discovery,
//! decoding, CFGs, loops, Ball-Larus numbering, call graph, checks), the
//! plan's JSON, and the regeneration of the first and last path number of
//! every function. Any panic, abort or timeout is a bug of the analyser:
//! untrusted ELF files must give an error or a plan, never a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use userspace_rewriter::analysis::elf::ElfInfo;
use userspace_rewriter::analysis::plan::{self, FunctionStatus, PlanOptions};

fuzz_target!(|data: &[u8]| {
    if let Ok(info) = ElfInfo::parse(data) {
        let _ = info.build_id_hex();
        let _ = info.base_svma();
        let _ = info.segment_for_svma(info.entry);
        for s in &info.segments {
            let _ = info.svma_for_file_offset(s.file_offset);
            let _ = info.load_bias(0x7f00_0000_0000, s.mapped_file_offset());
            let _ = s.file_offset_for_svma(info.entry);
        }
    }
    let Ok(report) = plan::analyze(data, &PlanOptions::default()) else {
        return;
    };
    let _ = serde_json::to_vec(&report.plan).expect("the plan serializes");
    for f in &report.plan.functions {
        if let FunctionStatus::Analyzed(fa) = &f.status
            && let Some(pn) = &fa.numbering
        {
            let n = pn.total_paths();
            assert!(n >= 1, "{}: no paths", f.name);
            pn.regenerate(0).expect("path 0 regenerates");
            pn.regenerate(n - 1).expect("path N-1 regenerates");
        }
    }
});
