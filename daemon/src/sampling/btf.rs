//! The kernel's own description of `struct task_struct` (BTF,
//! `/sys/kernel/btf/vmlinux`) → the field offsets the overflow program
//! needs to decide whether a burst signal would be invisible
//! ([`TaskLayout`]): the thread's blocked and pending signals, the
//! process's shared pending signals and signal handler table, and the
//! alternate signal stack.
//!
//! Offsets differ between kernel builds, so they are looked up at start-up
//! rather than compiled in; the eBPF program reads the fields with
//! `bpf_probe_read_kernel` at these offsets. Only the handful of BTF kinds
//! needed to walk struct members and resolve sizes are decoded (format:
//! the kernel's `Documentation/bpf/btf.rst`).
use std::collections::HashMap;

use anyhow::{Context as _, bail};
use burstyd_common::TaskLayout;

const BTF_MAGIC: u16 = 0xeb9f;

// BTF kinds (`BTF_KIND_*`).
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Clone, Debug)]
struct Member {
    name: u32,
    ty: u32,
    /// Bit offset (bitfields are not needed, and refused).
    bits: u32,
}

#[derive(Clone, Debug)]
struct Type {
    name: u32,
    kind: u32,
    /// `size` for INT/STRUCT/UNION/ENUM, `type` for PTR/TYPEDEF/CV.
    size_or_type: u32,
    members: Vec<Member>,
    /// ARRAY: (element type, element count).
    array: Option<(u32, u32)>,
}

/// A parsed BTF blob: types by id (id 0 is `void`) and the string table.
pub(crate) struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
    by_name: HashMap<(u32, String), u32>,
}

fn u16_at(b: &[u8], at: usize) -> anyhow::Result<u16> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .context("BTF truncated")
}

fn u32_at(b: &[u8], at: usize) -> anyhow::Result<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .context("BTF truncated")
}

impl Btf {
    pub(crate) fn parse(b: &[u8]) -> anyhow::Result<Btf> {
        if u16_at(b, 0)? != BTF_MAGIC {
            bail!("not BTF (bad magic; big-endian BTF is not supported)");
        }
        let hdr_len = u32_at(b, 4)? as usize;
        let (type_off, type_len) = (u32_at(b, 8)? as usize, u32_at(b, 12)? as usize);
        let (str_off, str_len) = (u32_at(b, 16)? as usize, u32_at(b, 20)? as usize);
        let types_at = hdr_len + type_off;
        let strings = b
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .context("BTF string section out of bounds")?
            .to_vec();
        let end = types_at + type_len;
        let mut types = vec![Type {
            name: 0,
            kind: 0,
            size_or_type: 0,
            members: Vec::new(),
            array: None,
        }];
        let mut at = types_at;
        while at < end {
            let name = u32_at(b, at)?;
            let info = u32_at(b, at + 4)?;
            let size_or_type = u32_at(b, at + 8)?;
            at += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 != 0;
            let mut t = Type {
                name,
                kind,
                size_or_type,
                members: Vec::new(),
                array: None,
            };
            match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => at += 4,
                KIND_ARRAY => {
                    t.array = Some((u32_at(b, at)?, u32_at(b, at + 8)?));
                    at += 12;
                }
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = at + 12 * i;
                        let off = u32_at(b, m + 8)?;
                        t.members.push(Member {
                            name: u32_at(b, m)?,
                            ty: u32_at(b, m + 4)?,
                            // With kind_flag, the top byte is a bitfield size.
                            bits: if kind_flag { off & 0xff_ffff } else { off },
                        });
                    }
                    at += 12 * vlen;
                }
                KIND_ENUM | KIND_FUNC_PROTO => at += 8 * vlen,
                KIND_DATASEC | KIND_ENUM64 => at += 12 * vlen,
                k if k <= KIND_ENUM64 => {}
                k => bail!("unknown BTF kind {k}"),
            }
            types.push(t);
        }
        let mut btf = Btf {
            types,
            strings,
            by_name: HashMap::new(),
        };
        for (id, t) in btf.types.iter().enumerate().skip(1) {
            if matches!(t.kind, KIND_STRUCT | KIND_UNION) {
                let name = btf.str_at(t.name).to_owned();
                btf.by_name.entry((t.kind, name)).or_insert(id as u32);
            }
        }
        Ok(btf)
    }

    fn str_at(&self, off: u32) -> &str {
        let s = self.strings.get(off as usize..).unwrap_or_default();
        let n = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..n]).unwrap_or("")
    }

    fn ty(&self, id: u32) -> anyhow::Result<&Type> {
        self.types
            .get(id as usize)
            .with_context(|| format!("BTF type id {id} out of range"))
    }

    /// Follows typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> anyhow::Result<u32> {
        for _ in 0..32 {
            let t = self.ty(id)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type
                }
                _ => return Ok(id),
            }
        }
        bail!("BTF type chain too long at id {id}")
    }

    fn size_of(&self, id: u32) -> anyhow::Result<u64> {
        let t = self.ty(self.resolve(id)?)?;
        Ok(match t.kind {
            KIND_PTR => 8,
            KIND_ARRAY => {
                let (elem, n) = t.array.context("array without element")?;
                self.size_of(elem)? * n as u64
            }
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 => t.size_or_type as u64,
            k => bail!("no size for BTF kind {k}"),
        })
    }

    fn struct_id(&self, name: &str) -> anyhow::Result<u32> {
        self.by_name
            .get(&(KIND_STRUCT, name.to_owned()))
            .copied()
            .with_context(|| format!("struct {name} not in the kernel's BTF"))
    }

    /// Byte offset and type of `field` in the struct or union `id`,
    /// looking through anonymous struct/union members (as C does).
    fn member(&self, id: u32, field: &str) -> anyhow::Result<(u64, u32)> {
        self.find_member(self.resolve(id)?, field)?
            .with_context(|| {
                format!(
                    "{} has no field `{field}` in the kernel's BTF",
                    self.str_at(self.types[id as usize].name)
                )
            })
    }

    fn find_member(&self, id: u32, field: &str) -> anyhow::Result<Option<(u64, u32)>> {
        let t = self.ty(id)?;
        for m in &t.members {
            let name = self.str_at(m.name);
            if name == field {
                if m.bits % 8 != 0 {
                    bail!("field `{field}` is a bitfield");
                }
                return Ok(Some((m.bits as u64 / 8, m.ty)));
            }
            if name.is_empty() {
                let inner = self.resolve(m.ty)?;
                if matches!(self.ty(inner)?.kind, KIND_STRUCT | KIND_UNION)
                    && let Some((off, ty)) = self.find_member(inner, field)?
                {
                    return Ok(Some((m.bits as u64 / 8 + off, ty)));
                }
            }
        }
        Ok(None)
    }

    /// Offset of a path of fields (`a.b.c`) from struct `root`.
    fn offset(&self, root: &str, path: &[&str]) -> anyhow::Result<u64> {
        let mut id = self.struct_id(root)?;
        let mut off = 0;
        for f in path {
            let (o, ty) = self.member(id, f)?;
            off += o;
            id = ty;
        }
        Ok(off)
    }

    /// The offsets the overflow program needs (see [`TaskLayout`]).
    pub(crate) fn task_layout(&self) -> anyhow::Result<TaskLayout> {
        let u32_of = |v: u64, what: &str| -> anyhow::Result<u32> {
            u32::try_from(v).with_context(|| format!("{what} offset {v} is too large"))
        };
        let sigset = self.size_of(self.member(self.struct_id("task_struct")?, "blocked")?.1)?;
        if sigset != 8 {
            bail!("sigset_t is {sigset} bytes here; burstyd expects 8 (x86-64, 64 signals)");
        }
        let k_sigaction = self.struct_id("k_sigaction")?;
        Ok(TaskLayout {
            blocked: u32_of(self.offset("task_struct", &["blocked"])?, "blocked")?,
            pending: u32_of(
                self.offset("task_struct", &["pending", "signal"])?,
                "pending",
            )?,
            signal: u32_of(self.offset("task_struct", &["signal"])?, "signal")?,
            shared_pending: u32_of(
                self.offset("signal_struct", &["shared_pending", "signal"])?,
                "shared_pending",
            )?,
            sighand: u32_of(self.offset("task_struct", &["sighand"])?, "sighand")?,
            action: u32_of(self.offset("sighand_struct", &["action"])?, "action")?,
            handler: u32_of(
                self.offset("k_sigaction", &["sa", "sa_handler"])?,
                "sa_handler",
            )?,
            action_size: u32_of(self.size_of(k_sigaction)?, "k_sigaction")?,
            sas_ss_sp: u32_of(self.offset("task_struct", &["sas_ss_sp"])?, "sas_ss_sp")?,
            sas_ss_size: u32_of(self.offset("task_struct", &["sas_ss_size"])?, "sas_ss_size")?,
            real_parent: u32_of(self.offset("task_struct", &["real_parent"])?, "real_parent")?,
            tgid: u32_of(self.offset("task_struct", &["tgid"])?, "tgid")?,
        })
    }
}

/// Reads the running kernel's task layout.
pub(crate) fn kernel_task_layout() -> anyhow::Result<TaskLayout> {
    let path = "/sys/kernel/btf/vmlinux";
    let bytes = std::fs::read(path).with_context(|| format!("reading {path}"))?;
    Btf::parse(&bytes)
        .and_then(|b| b.task_layout())
        .with_context(|| format!("reading the task layout from {path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built blob: `struct s { int a; struct { long b; }; }` with a
    /// typedef'd array member, checked against the offsets C gives.
    #[test]
    fn members_sizes_and_anonymous_structs() {
        let mut strings = b"\0int\0long\0s\0a\0b\0arr\0td\0".to_vec();
        let name = |s: &str, t: &[u8]| -> u32 {
            let needle = format!("\0{s}\0");
            t.windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap() as u32
                + 1
        };
        let (int, long, s, a, b, arr, td) = (
            name("int", &strings),
            name("long", &strings),
            name("s", &strings),
            name("a", &strings),
            name("b", &strings),
            name("arr", &strings),
            name("td", &strings),
        );
        strings.push(0);
        let mut t = Vec::new();
        let mut ty = |name: u32, kind: u32, vlen: u32, sz: u32, extra: &[u32]| {
            for w in [name, kind << 24 | vlen, sz].iter().chain(extra) {
                t.extend_from_slice(&w.to_le_bytes());
            }
        };
        ty(int, KIND_INT, 0, 4, &[32]); // 1: int
        ty(long, KIND_INT, 0, 8, &[64]); // 2: long
        ty(0, KIND_STRUCT, 1, 8, &[b, 2, 0]); // 3: struct { long b; }
        ty(0, KIND_ARRAY, 0, 0, &[1, 1, 3]); // 4: int[3]
        ty(td, KIND_TYPEDEF, 0, 4, &[]); // 5: typedef int[3] td
        ty(s, KIND_STRUCT, 3, 32, &[a, 1, 0, 0, 3, 64, arr, 5, 128]); // 6
        let mut blob = Vec::new();
        for w in [
            u32::from(BTF_MAGIC) | 1 << 16,
            24,
            0,
            t.len() as u32,
            t.len() as u32,
            strings.len() as u32,
        ] {
            blob.extend_from_slice(&w.to_le_bytes());
        }
        blob.extend_from_slice(&t);
        blob.extend_from_slice(&strings);
        let btf = Btf::parse(&blob).unwrap();
        assert_eq!(btf.offset("s", &["a"]).unwrap(), 0);
        assert_eq!(btf.offset("s", &["b"]).unwrap(), 8);
        assert_eq!(btf.offset("s", &["arr"]).unwrap(), 16);
        let (_, arr_ty) = btf.member(6, "arr").unwrap();
        assert_eq!(btf.size_of(arr_ty).unwrap(), 12);
        assert!(btf.offset("s", &["nope"]).is_err());
        assert!(btf.struct_id("missing").is_err());
    }

    /// The running kernel's layout is plausible: fields in order of their
    /// declaration in `struct task_struct` and within its size.
    #[test]
    fn this_kernels_task_layout() {
        let Ok(bytes) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipping: /sys/kernel/btf/vmlinux is absent (kernel without BTF)");
            return;
        };
        let btf = Btf::parse(&bytes).unwrap();
        let l = btf.task_layout().unwrap();
        let task = btf.size_of(btf.struct_id("task_struct").unwrap()).unwrap() as u32;
        for off in [
            l.blocked,
            l.pending,
            l.signal,
            l.sighand,
            l.sas_ss_sp,
            l.real_parent,
            l.tgid,
        ] {
            assert!(off > 0 && off < task, "{l:?}");
        }
        // `struct sigaction`'s first member is the handler; 64 actions.
        assert_eq!(l.handler, 0);
        assert!(l.action_size >= 24, "{l:?}");
        assert_eq!(l.sas_ss_size, l.sas_ss_sp + 8, "{l:?}");
    }
}
