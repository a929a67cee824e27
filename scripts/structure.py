#!/usr/bin/env python3
"""Import cycles inside each crate of the workspace: none may exist.

A crate's modules form a tree of rooms (a file, or a folder with its face,
`mod.rs`, and the files under it). At every level of that tree, the rooms
side by side must import each other without a circle: a file may use a
sibling, a sibling's room, or anything below its own room's floor, but no
two rooms may lean on each other. A circle of files is one such case; two
folders whose files use each other is another.

What counts as an import: a path that starts at `crate::`, `super::` or
`self::` (in a `use` or anywhere in the code), resolved to the deepest module
file it names, through the `pub use` re-exports of faces. Paths through other
crates are the crate graph's business (cargo refuses cycles there).

    scripts/structure.py              check the workspace; exit 1 on a circle
    scripts/structure.py --self-test  check that a planted circle is found

Why a script of our own: the tools that draw the house live outside the
repository; this one runs in `make test` on a clean machine (python3 only).
"""

import os
import re
import sys
import tempfile

# Limits: a re-export chain is followed this many steps at most, so a
# re-export loop cannot hang the check.
REEXPORT_DEPTH_MAX = 8

INLINE = "<inline>"


def strip(text):
    """Comments, strings and char literals blanked (lengths kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 8]) and not re.match(r"\w", text[i - 1:i] or " "):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or text.startswith("'\\", i):
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\x..|\\.|[^\\'])'", text[i:])
            j = i + (len(m.group(0)) if m else 1)
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Module:
    def __init__(self, path, file, dir_for_children):
        self.path = path  # tuple of names from the crate root
        self.file = file
        self.dir = dir_for_children
        self.children = {}  # name -> Module
        self.text = strip(open(file, encoding="utf-8").read())
        self.reexports = {}  # name -> absolute path (tuple)


MOD_RE = re.compile(r'((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;')
PATH_ATTR_RE = re.compile(r'#\[\s*path\s*=\s*"([^"]+)"\s*\]')


def load_tree(root_file):
    """The crate's module tree, from `mod x;` declarations (with #[path])."""
    raw = open(root_file, encoding="utf-8").read()
    root = Module((), root_file, os.path.dirname(root_file))
    stack = [(root, raw)]
    while stack:
        module, raw = stack.pop()
        # The raw text: #[path = "..."] is a string, blanked in `text`.
        for m in MOD_RE.finditer(strip_comments_only(raw)):
            attrs, name = m.group(1), m.group(2)
            p = PATH_ATTR_RE.search(attrs or "")
            if p:
                file = os.path.normpath(os.path.join(os.path.dirname(module.file), p.group(1)))
                child_dir = os.path.join(os.path.dirname(file), os.path.splitext(os.path.basename(file))[0])
            else:
                flat = os.path.join(module.dir, name + ".rs")
                nested = os.path.join(module.dir, name, "mod.rs")
                file = flat if os.path.exists(flat) else nested
                child_dir = os.path.join(module.dir, name) if file == flat else os.path.dirname(nested)
            if not os.path.exists(file):
                continue  # cfg'd out or generated: nothing to read
            child = Module(module.path + (name,), file, child_dir)
            module.children[name] = child
            stack.append((child, open(file, encoding="utf-8").read()))
    return root


def strip_comments_only(text):
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def split_top(s, sep=","):
    parts, depth, cur = [], 0, []
    for c in s:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand_use(tree):
    """`a::{b, c::{d as e}}` -> [(path segments, alias)], `self` folded."""
    tree = re.sub(r"\s*::\s*", "::", tree.strip())
    m = re.match(r"^(.*?)::\{(.*)\}$", tree, re.S)
    if m:
        prefix = [s for s in m.group(1).split("::") if s]
        out = []
        for part in split_top(m.group(2)):
            for segs, alias in expand_use(part):
                out.append((prefix if segs == ["self"] else prefix + segs, alias))
        return out
    if tree.startswith("{") and tree.endswith("}"):
        return [r for part in split_top(tree[1:-1]) for r in expand_use(part)]
    m = re.match(r"^(.*?)(?:\s+as\s+(\w+))?$", tree, re.S)
    return [([s for s in m.group(1).split("::") if s], m.group(2))]


USE_RE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
PATH_RE = re.compile(r"(?<![\w:])((?:crate|super|self)(?:\s*::\s*\w+)+)")


def inline_depths(text):
    """For each offset, how many inline `mod name { ... }` blocks enclose it:
    a list of (start, end) spans of inline module bodies."""
    spans = []
    for m in re.finditer(r"\bmod\s+\w+\s*\{", text):
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        spans.append((m.end(), j))
    return spans


def absolute(module, segs, at, spans):
    """A path's segments made absolute from the crate root, or None."""
    here = list(module.path) + [INLINE] * sum(1 for s, e in spans if s <= at < e)
    if not segs:
        return None
    head, rest = segs[0], segs[1:]
    if head == "crate":
        base = []
    elif head == "self":
        base = here
    elif head == "super":
        base = here[:-1]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    else:
        return None
    if INLINE in base:  # inside this file's own inline modules: the file
        return tuple(s for s in base if s != INLINE)
    return tuple(base) + tuple(rest)


def find(root, path):
    """The module a path ends in (deepest file), and the segments after it."""
    node = root
    for i, seg in enumerate(path):
        if seg in node.children:
            node = node.children[seg]
        else:
            return node, path[i:]
    return node, ()


def resolve(root, path, depth=0):
    node, rest = find(root, path)
    if rest and rest[0] in node.reexports and depth < REEXPORT_DEPTH_MAX:
        return resolve(root, node.reexports[rest[0]] + tuple(rest[1:]), depth + 1)
    return node


def all_modules(root):
    out, stack = [], [root]
    while stack:
        m = stack.pop()
        out.append(m)
        stack.extend(m.children.values())
    return out


def read_reexports(root):
    for module in all_modules(root):
        spans = inline_depths(module.text)
        for m in USE_RE.finditer(module.text):
            if not m.group(1):
                continue
            for segs, alias in expand_use(m.group(2)):
                if segs and segs[0] not in ("crate", "super", "self") and segs[0] in module.children:
                    segs = ["self"] + segs
                path = absolute(module, segs, m.start(), spans)
                if path and segs[-1] != "*":
                    module.reexports[alias or segs[-1]] = path


def edges(root):
    """(from file, to file) for every import between two files of the crate."""
    out = {}
    for module in all_modules(root):
        spans = inline_depths(module.text)
        refs = []
        for m in USE_RE.finditer(module.text):
            for segs, _ in expand_use(m.group(2)):
                if segs and segs[0] in module.children:
                    segs = ["self"] + segs
                refs.append((segs, m.start()))
        for m in PATH_RE.finditer(module.text):
            refs.append((re.sub(r"\s+", "", m.group(1)).split("::"), m.start()))
        for segs, at in refs:
            segs = [s for s in segs if s != "*"]
            path = absolute(module, segs, at, spans)
            if path is None:
                continue
            target = resolve(root, path)
            if target.file != module.file:
                out.setdefault((module.file, target.file), set()).add("::".join(segs))
    return out


def unit_of(root_path, module_path):
    """The room directly under `root_path` that holds `module_path`
    (`root_path` itself for its face), or None if outside."""
    n = len(root_path)
    if module_path[:n] != root_path:
        return None
    return module_path[:n + 1]


def sccs(nodes, graph):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        # Iterative Tarjan: a deep graph cannot overflow Python's stack.
        work = [(v, iter(graph.get(v, ())))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph.get(w, ()))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(comp)

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def circles(root):
    """Every circle, at every level of the room tree: (level, rooms, ties)."""
    by_file = {m.file: m.path for m in all_modules(root)}
    file_edges = edges(root)
    found = []
    for level in all_modules(root):
        if not level.children:
            continue
        graph, ties = {}, {}
        for (a, b), names in file_edges.items():
            ua, ub = unit_of(level.path, by_file[a]), unit_of(level.path, by_file[b])
            # The face (the level's own file) is the room's hub: its ties
            # to the parts under it are the room's inside, not a circle.
            if ua is None or ub is None or ua == ub or level.path in (ua, ub):
                continue
            graph.setdefault(ua, set()).add(ub)
            ties.setdefault((ua, ub), []).append((a, b, sorted(names)))
        for comp in sccs(sorted(graph), graph):
            members = set(comp)
            tie_list = [t for (ua, ub), ts in sorted(ties.items()) if ua in members and ub in members for t in ts]
            found.append((level, sorted(comp), tie_list))
    return found


def crate_roots(workspace):
    roots = []
    text = open(os.path.join(workspace, "Cargo.toml"), encoding="utf-8").read()
    members = re.search(r"members\s*=\s*\[(.*?)\]", text, re.S).group(1)
    for member in re.findall(r'"([^"]+)"', members):
        for name in ("lib.rs", "main.rs"):
            f = os.path.join(workspace, member, "src", name)
            if os.path.exists(f):
                roots.append((member, f))
    return roots


def room_name(path):
    return "::".join(path) if path else "(crate root)"


def check(workspace):
    bad = 0
    for member, root_file in crate_roots(workspace):
        root = load_tree(root_file)
        read_reexports(root)
        for level, comp, ties in circles(root):
            bad += 1
            print(f"circle in {member}, among the rooms of {room_name(level.path)}: "
                  + " <-> ".join(room_name(c) for c in comp))
            for a, b, names in ties:
                print(f"  {os.path.relpath(a, workspace)} -> {os.path.relpath(b, workspace)}: "
                      + ", ".join(names[:4]))
    return bad


def self_test():
    """A planted circle must be found; the same crate without it must pass."""
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "c", "src", "room"))
        open(os.path.join(d, "Cargo.toml"), "w").write('[workspace]\nmembers = ["c"]\n')
        files = {
            "lib.rs": "mod a;\nmod room;\npub use room::Thing;\n",
            "a.rs": "// crate::room::b::X in a comment is no import\n"
                    "pub struct A;\nconst S: &str = \"crate::room::b\";\n",
            "room/mod.rs": "mod b;\nmod c;\npub use b::Thing;\n",
            "room/b.rs": "use super::c::C;\npub struct Thing;\n",
            "room/c.rs": "pub struct C;\nfn f() -> crate::a::A { crate::a::A }\n",
        }
        for name, text in files.items():
            open(os.path.join(d, "c", "src", name), "w").write(text)
        assert check(d) == 0, "no circle planted yet"
        # a -> room (through the crate root's re-export) and room -> a.
        open(os.path.join(d, "c", "src", "a.rs"), "w").write("use crate::Thing;\npub struct A;\n")
        assert check(d) == 1, "a circle of rooms: a -> room::b, room::c -> a"
        # Siblings in one folder: b -> c and c -> b.
        open(os.path.join(d, "c", "src", "a.rs"), "w").write("pub struct A;\n")
        open(os.path.join(d, "c", "src", "room", "c.rs"), "w").write(
            "pub struct C;\n#[cfg(test)]\nmod tests {\n    use super::super::b::Thing;\n}\n")
        assert check(d) == 1, "a circle of files: room::b <-> room::c"
    print("structure self-test: planted circles found, clean crate passes")


def main():
    workspace = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    bad = check(workspace)
    if bad:
        print(f"{bad} import circle(s); see docs/architecture.md, 'Rooms'")
        return 1
    print("structure: no import circle in any crate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
