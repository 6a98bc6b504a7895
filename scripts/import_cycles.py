#!/usr/bin/env python3
"""Import cycles among the source files of Rust crates (stdlib only).

For each crate `src/` directory given (default: the workspace's four), every
.rs file is mapped to its module path by following `mod x;` declarations
from the crate roots (lib.rs and main.rs, each a crate of its own; a file no
root reaches is placed by its path under the library, else the binary).
`foo.rs` and `foo/mod.rs` are both module `foo`.

An edge A -> B means file A names an item of file B by path:
  - `use crate::...`, `use super::...`, `use self::...`, and `use x::...`
    where `x` is a child module or a module brought in scope by another
    `use` (grouped trees and multi-line trees included);
  - the same paths inline in code (`crate::a::b::Item`, `super::X`,
    `$crate::...` in macros, `runtime::assemble` after `use super::runtime`).
Each path resolves to its longest prefix that is a file's module; the name
after it is recorded on the edge. Comments and string literals are
skipped, as are `#[cfg(test)] mod x { ... }` blocks and files declared
`#[cfg(test)] mod x;` (tests may import anything). A parent declaring
`mod child;` is not an edge; a parent re-exporting (`pub use child::X`) is.
Self-edges are dropped.

Reported:
  1. every cycle among files: strongly connected components of more than
     one file, with the edges inside them and the names that make them;
  2. cycles among a crate's top-level modules (`crate::bursts::*` files vs
     `crate::export::*` files): any file edge between two different
     top-level modules is an edge between them (the crate root file is
     left out of this view).

Exit status 1 if there is any cycle (2 on a usage error), else 0 with
`import_cycles: N files, M edges, no cycle`.

  scripts/import_cycles.py [--list] [SRC_DIR ...]
  scripts/import_cycles.py --self-test
"""

import os
import re
import sys
import tempfile

DEFAULT_DIRS = ["daemon/src", "userspace-rewriter/src", "common/src", "ebpf/src"]

IDENT = r"(?:r#)?[A-Za-z_][A-Za-z0-9_]*"
KEYWORD_SEGS = {"crate", "$crate", "super", "self"}


# ---------------------------------------------------------------- lexing


def strip_code(src):
    """`src` with comments and string/char literal contents blanked
    (newlines kept, so offsets and line numbers stay)."""
    out = list(src)
    n = len(src)
    i = 0

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if c == "/" and src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif c == "/" and src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c in "rb" and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'(?:br|rb|r)(#*)"', src[i:i + 300])
            if m:
                close = '"' + m.group(1)
                j = src.find(close, i + m.end())
                j = n if j < 0 else j + len(close)
                blank(i + 1, j)
                i = j
            elif src.startswith('b"', i) or src.startswith("b'", i):
                i += 1  # the literal itself is handled next round
            else:
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}', '\'') or a lifetime.
            m = re.match(r"'(?:\\u\{[0-9A-Fa-f]*\}|\\x[0-9A-Fa-f]{2}|\\.|[^\\'\n])'", src[i:i + 16])
            if m:
                blank(i + 1, i + m.end() - 1)
                i += m.end()
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def matching_brace(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


ATTR = r"#\s*!?\s*\[[^\]]*\]"
TEST_MOD = re.compile(
    r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]\s*(?:" + ATTR + r"\s*)*"
    r"(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*([{;])"
)
MOD_DECL = re.compile(
    r"(?<![\w$])(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*([{;])"
)


def remove_test_modules(code):
    """Blanks `#[cfg(test)] mod x { ... }`; returns (code, test-only child
    names declared `#[cfg(test)] mod x;`)."""
    test_children = set()
    while True:
        m = None
        for m2 in TEST_MOD.finditer(code):
            if m2.group(2) == "{":
                m = m2
                break
            test_children.add(m2.group(1).removeprefix("r#"))
        if m is None:
            return code, test_children
        end = matching_brace(code, m.end() - 1)
        code = code[: m.start()] + "".join(
            "\n" if ch == "\n" else " " for ch in code[m.start(): end + 1]
        ) + code[end + 1:]


# ---------------------------------------------------------------- use trees

TOKEN = re.compile(r"\s*(::|\$crate|" + IDENT + r"|[{},*;])")


def tokenize(s):
    toks, i = [], 0
    while i < len(s):
        m = TOKEN.match(s, i)
        if not m:
            if s[i:].strip() == "":
                break
            i += 1  # something odd (a stray character): skip it
            continue
        toks.append(m.group(1).removeprefix("r#"))
        i = m.end()
    return toks


def parse_use_tree(toks):
    """Leaves of a use tree: [(segments, bound_name_or_None)]; segments end
    in '*' for a glob. `a::{self, b as c}` gives (['a'], 'a'),
    (['a', 'b'], 'c')."""
    pos = 0

    def tree(prefix):
        nonlocal pos
        out = []
        segs = list(prefix)
        if pos < len(toks) and toks[pos] == "::":  # `::std::x`: extern
            pos += 1
            segs.append("::")
        while pos < len(toks):
            t = toks[pos]
            if t == "{":
                pos += 1
                while pos < len(toks) and toks[pos] != "}":
                    out += tree(segs)
                    if pos < len(toks) and toks[pos] == ",":
                        pos += 1
                pos += 1  # '}'
                return out
            if t == "*":
                pos += 1
                return out + [(segs + ["*"], None)]
            if t in ("}", ",", ";"):
                return out
            pos += 1
            if t == "self" and segs and segs[-1] not in KEYWORD_SEGS:
                bound = segs[-1]  # `a::{self}` is `a`
            else:
                segs.append(t)
                bound = t
            if pos < len(toks) and toks[pos] == "::":
                pos += 1
                continue
            if pos < len(toks) and toks[pos] == "as":
                bound = toks[pos + 1] if pos + 1 < len(toks) else bound
                pos += 2
            return out + [(segs, bound)]
        return out

    return tree([])


USE_STMT = re.compile(r"(?<![\w$])use\s")
INLINE_PATH = re.compile(
    r"(?<![\w$:])((?:\$crate|" + IDENT + r")(?:\s*::\s*(?:" + IDENT + r"))+)"
)


# ---------------------------------------------------------------- crates


class Crate:
    def __init__(self, src, kind):
        self.src = src
        self.kind = kind  # "lib" or "bin"
        self.modules = {}  # module path tuple -> file (relative to src)


def child_file(src, parent_file, name):
    """The file of child module `name` declared in `parent_file`."""
    d = os.path.dirname(parent_file)
    base = os.path.basename(parent_file)
    if base not in ("mod.rs", "lib.rs", "main.rs"):
        d = os.path.join(d, base[:-3])
    for cand in (os.path.join(d, name + ".rs"), os.path.join(d, name, "mod.rs")):
        if os.path.isfile(os.path.join(src, cand)):
            return cand
    return None


def path_module(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


class Graph:
    def __init__(self):
        self.files = {}  # (src, rel) -> (crate, module path)
        self.codes = {}  # (src, rel) -> stripped code
        self.test_files = []
        self.edges = {}  # (from key, to key) -> set of names
        self.crates = []


def load(src_dirs):
    g = Graph()
    for src in src_dirs:
        if not os.path.isdir(src):
            raise SystemExit(f"import_cycles: no such directory: {src}")
        all_rs = []
        for dp, dns, fns in os.walk(src):
            dns.sort()
            for f in sorted(fns):
                if f.endswith(".rs"):
                    all_rs.append(os.path.relpath(os.path.join(dp, f), src))
        stripped = {}
        tests = {}
        for rel in all_rs:
            with open(os.path.join(src, rel), encoding="utf-8", errors="replace") as fh:
                code, t = remove_test_modules(strip_code(fh.read()))
            stripped[rel], tests[rel] = code, t
        placed = set()
        test_only = set()
        crates = []
        for root, kind in (("lib.rs", "lib"), ("main.rs", "bin")):
            if root not in stripped:
                continue
            c = Crate(src, kind)
            crates.append(c)
            todo = [(root, ())]
            while todo:
                rel, mp = todo.pop()
                if rel in placed:
                    continue
                placed.add(rel)
                c.modules[mp] = rel
                for m in MOD_DECL.finditer(stripped[rel]):
                    if m.group(2) != ";":
                        continue
                    name = m.group(1).removeprefix("r#")
                    cf = child_file(src, rel, name)
                    if cf is not None and name not in tests[rel]:
                        todo.append((cf, mp + (name,)))
                for name in tests[rel]:
                    cf = child_file(src, rel, name)
                    if cf is not None:
                        test_only.add(cf)
        # Files behind `#[cfg(test)] mod x;`, and everything under them.
        for rel in all_rs:
            mp = path_module(rel)
            if any(
                path_module(t) == mp[: len(path_module(t))] for t in test_only
            ) and rel not in placed:
                g.test_files.append(os.path.join(src, rel))
        stray = [
            r for r in all_rs if r not in placed and os.path.join(src, r) not in g.test_files
        ]
        if stray:
            c = crates[0] if crates else Crate(src, "lib")
            if not crates:
                crates.append(c)
            for rel in stray:
                c.modules.setdefault(path_module(rel), rel)
                placed.add(rel)
        for c in crates:
            g.crates.append(c)
            for mp, rel in c.modules.items():
                g.files[(src, rel)] = (c, mp)
                g.codes[(src, rel)] = stripped[rel]
    for key in sorted(g.files):
        collect_edges(g, key)
    return g


def inline_modules(code):
    """[(start, end, name)] of inline (non-test) `mod x { ... }` blocks."""
    out = []
    for m in MOD_DECL.finditer(code):
        if m.group(2) == "{":
            out.append((m.end() - 1, matching_brace(code, m.end() - 1), m.group(1)))
    return out


def collect_edges(g, key):
    crate, mp = g.files[key]
    code = g.codes[key]
    inl = inline_modules(code)
    children = {
        m.group(1).removeprefix("r#") for m in MOD_DECL.finditer(code) if m.group(2) == ";"
    }

    def module_at(pos):
        extra = [name for (a, b, name) in sorted(inl) if a < pos < b]
        return mp + tuple(extra)

    aliases = {}  # name -> absolute module path (a file's module)

    def absolute(segs, pos):
        cur = module_at(pos)
        first = segs[0]
        if first in ("crate", "$crate"):
            return list(segs[1:])
        if first == "self":
            return list(cur) + list(segs[1:])
        if first == "super":
            base = list(cur)
            k = 0
            while k < len(segs) and segs[k] == "super":
                if not base:
                    return None
                base.pop()
                k += 1
            return base + list(segs[k:])
        if first in aliases:
            return list(aliases[first]) + list(segs[1:])
        if first in children and cur == mp:
            return list(mp) + list(segs)
        return None  # an extern crate, a type, a local name

    def resolve(segs, pos):
        """(target key, name) or None."""
        full = absolute(segs, pos)
        if full is None:
            return None
        for k in range(len(full), -1, -1):
            rel = crate.modules.get(tuple(full[:k]))
            if rel is not None:
                rest = full[k:]
                if rest:
                    name = rest[0]
                else:
                    name = full[k - 1] if k else "crate"
                return (crate.src, rel), name, full[:k] == full
        return None

    def add(target, name):
        if target != key:
            g.edges.setdefault((key, target), set()).add(name)

    # Use statements first (they bring module aliases in scope), then
    # inline paths outside them.
    uses = []
    spans = []
    for m in USE_STMT.finditer(code):
        start = m.end()
        end = code.find(";", start)
        if end < 0:
            continue
        uses.append((m.start(), parse_use_tree(tokenize(code[start:end]))))
        spans.append((m.start(), end + 1))
    # Two passes, so `use a::b; use b::c;` resolves in any order.
    for _ in range(2):
        for pos, leaves in uses:
            for segs, bound in leaves:
                if not segs or segs[0] == "::" or "::" in segs:
                    continue
                r = resolve([s for s in segs if s != "*"], pos)
                if r and r[2] and bound:
                    aliases[bound] = g.files[r[0]][1]
    for pos, leaves in uses:
        for segs, bound in leaves:
            if not segs or segs[0] == "::" or "::" in segs:
                continue
            glob = segs[-1] == "*"
            r = resolve([s for s in segs if s != "*"], pos)
            if r:
                add(r[0], "*" if glob and r[2] else r[1])

    masked = list(code)
    for a, b in spans:
        for k in range(a, b):
            if masked[k] != "\n":
                masked[k] = " "
    masked = "".join(masked)
    for m in INLINE_PATH.finditer(masked):
        segs = [s.strip().removeprefix("r#") for s in m.group(1).split("::")]
        if segs[0] not in KEYWORD_SEGS and segs[0] not in aliases and segs[0] not in children:
            continue
        r = resolve(segs, m.start())
        if r:
            add(r[0], r[1])


# ---------------------------------------------------------------- cycles


def sccs(nodes, succ):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(succ.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def analyse(g):
    """(file cycles, folder cycles): lists of (members, [(a, b, detail)])."""
    succ = {}
    for a, b in g.edges:
        succ.setdefault(a, set()).add(b)
    file_cycles = []
    for comp in sccs(sorted(g.files), succ):
        if len(comp) < 2:
            continue
        members = set(comp)
        inside = [
            (a, b, ", ".join(sorted(g.edges[(a, b)])))
            for (a, b) in sorted(g.edges)
            if a in members and b in members
        ]
        file_cycles.append((comp, inside))
    folder_cycles = []
    for crate in g.crates:
        fedges = {}
        for (a, b), names in g.edges.items():
            (ca, ma), (cb, mb) = g.files[a], g.files[b]
            if ca is not crate or cb is not crate or not ma or not mb or ma[0] == mb[0]:
                continue
            fedges.setdefault((ma[0], mb[0]), []).append(
                f"{a[1]} -> {b[1]} ({', '.join(sorted(names))})"
            )
        fsucc = {}
        for a, b in fedges:
            fsucc.setdefault(a, set()).add(b)
        tops = sorted({mp[0] for mp in crate.modules if mp})
        for comp in sccs(tops, fsucc):
            if len(comp) < 2:
                continue
            members = set(comp)
            inside = [
                (a, b, "; ".join(sorted(fedges[(a, b)])))
                for (a, b) in sorted(fedges)
                if a in members and b in members
            ]
            folder_cycles.append((crate, comp, inside))
    return file_cycles, folder_cycles


def name(key):
    return os.path.join(key[0], key[1])


def report(g, list_edges=False, out=sys.stdout):
    if list_edges:
        for (a, b), names in sorted(g.edges.items()):
            print(f"{name(a)} -> {name(b)}: {', '.join(sorted(names))}", file=out)
    file_cycles, folder_cycles = analyse(g)
    for comp, inside in file_cycles:
        print(f"file cycle ({len(comp)} files): " + ", ".join(name(k) for k in comp), file=out)
        for a, b, names in inside:
            print(f"  {name(a)} -> {name(b)}: {names}", file=out)
    for crate, comp, inside in folder_cycles:
        where = f"{crate.src} ({crate.kind})"
        print(f"folder cycle in {where}: " + " <-> ".join(comp), file=out)
        for a, b, detail in inside:
            print(f"  {a} -> {b}: {detail}", file=out)
    nf, ne = len(g.files), len(g.edges)
    if file_cycles or folder_cycles:
        print(
            f"import_cycles: {nf} files, {ne} edges, {len(file_cycles)} file cycles, "
            f"{len(folder_cycles)} folder cycles",
            file=out,
        )
        return 1
    print(f"import_cycles: {nf} files, {ne} edges, no cycle", file=out)
    return 0


# ---------------------------------------------------------------- self-test

SELF_TEST_CRATES = {
    # A file cycle a.rs <-> b/mod.rs (and so a folder cycle a <-> b), made
    # by a re-export, a multi-line grouped use and an inline path; the
    # comment, string, test block and test-only file name each other but
    # must not count.
    "cyclic/src": {
        "lib.rs": "mod a;\nmod b;\npub mod c;\npub use a::X;\n",
        "a.rs": (
            "use crate::{\n    b::{self, Y as Why},\n    c::Z,\n};\n"
            "// use crate::c::inner::Q; in a comment\n"
            "pub struct X;\n"
            "fn f() -> &'static str { let _ = b::helper(); \"crate::c::inner::Q\" }\n"
            "#[cfg(test)]\nmod tests {\n    use crate::c::inner::Q;\n}\n"
        ),
        "b/mod.rs": (
            "mod sub;\n#[cfg(test)]\nmod tests;\n"
            "pub struct Y;\npub fn helper() -> u32 { let c = 'x'; 0 }\n"
            "fn g(_: crate::a::X) {}\n"
        ),
        "b/sub.rs": "use super::Y;\nuse std::collections::HashMap;\n",
        "b/tests.rs": "use crate::c::inner::Q;\n",
        "c/mod.rs": "pub mod inner;\npub struct Z;\n",
        "c/inner.rs": "/* use crate::a::X; */\npub struct Q;\n",
    },
    # No file cycle, but a folder one: p/one.rs -> q/two.rs and
    # q/three.rs -> p/four.rs.
    "folders/src": {
        "main.rs": "mod p;\nmod q;\nfn main() {}\n",
        "p/mod.rs": "mod four;\nmod one;\n",
        "p/one.rs": "use crate::q::two::T;\n",
        "p/four.rs": "pub struct F;\n",
        "q/mod.rs": "pub mod three;\npub mod two;\n",
        "q/two.rs": "pub struct T;\n",
        "q/three.rs": "fn h(_: super::super::p::four::F) {}\n",
    },
    # Clean: edges only downward.
    "clean/src": {
        "lib.rs": "pub mod top;\nmod leaf;\npub use top::run;\n",
        "top.rs": "use crate::leaf::{Leaf, make};\npub fn run() -> Leaf { make() }\n",
        "leaf.rs": "pub struct Leaf;\npub fn make() -> Leaf { Leaf }\n",
    },
}


def self_test():
    import io

    failures = []

    def check(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got!r}, want {want!r}")

    with tempfile.TemporaryDirectory() as tmp:
        for src, files in SELF_TEST_CRATES.items():
            for rel, text in files.items():
                p = os.path.join(tmp, src, rel)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "w") as fh:
                    fh.write(text)
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            g = load(["cyclic/src"])
            edges = {(a[1], b[1]): sorted(n) for (a, b), n in g.edges.items()}
            check(
                "cyclic edges",
                edges,
                {
                    ("lib.rs", "a.rs"): ["X"],
                    ("a.rs", "b/mod.rs"): ["Y", "b", "helper"],
                    ("a.rs", "c/mod.rs"): ["Z"],
                    ("b/mod.rs", "a.rs"): ["X"],
                    ("b/sub.rs", "b/mod.rs"): ["Y"],
                },
            )
            check("cyclic test-only files", g.test_files, ["cyclic/src/b/tests.rs"])
            fc, dc = analyse(g)
            check(
                "cyclic file cycles",
                [[k[1] for k in comp] for comp, _ in fc],
                [["a.rs", "b/mod.rs"]],
            )
            check(
                "cyclic folder cycles",
                [comp for _, comp, _ in dc],
                [["a", "b"]],
            )
            check("cyclic exit", report(g, out=io.StringIO()), 1)

            g = load(["folders/src"])
            fc, dc = analyse(g)
            check("folders file cycles", fc, [])
            check("folders folder cycles", [comp for _, comp, _ in dc], [["p", "q"]])
            check("folders exit", report(g, out=io.StringIO()), 1)

            g = load(["clean/src"])
            fc, dc = analyse(g)
            check("clean cycles", (fc, dc), ([], []))
            buf = io.StringIO()
            check("clean exit", report(g, out=buf), 0)
            check(
                "clean summary",
                buf.getvalue().strip(),
                "import_cycles: 3 files, 2 edges, no cycle",
            )
        finally:
            os.chdir(cwd)
    for f in failures:
        print("self-test FAILED: " + f)
    if failures:
        return 1
    print("import_cycles: self-test passed")
    return 0


def main(argv):
    args = argv[1:]
    if "-h" in args or "--help" in args:
        print(__doc__)
        return 0
    if "--self-test" in args:
        return self_test()
    list_edges = "--list" in args
    dirs = [a for a in args if not a.startswith("--")]
    unknown = [a for a in args if a.startswith("--") and a != "--list"]
    if unknown:
        print(f"import_cycles: unknown option {unknown[0]}", file=sys.stderr)
        return 2
    return report(load(dirs or DEFAULT_DIRS), list_edges)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
