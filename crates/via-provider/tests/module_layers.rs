//! The provider's modules form layers: no module reaches, through the
//! modules it imports, back to itself (`docs/architecture.md`).  A module
//! may use its parent and its children; the crate root's tables
//! (`provider()`) are the top.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every module of `src`, by path (`vi`, `transport::udp::send`), with its
/// source outside comments and unit tests.
fn modules(src: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap().with_extension("");
        let mut name = rel.to_string_lossy().replace('/', "::");
        if let Some(parent) = name.strip_suffix("::mod") {
            name = parent.to_string();
        }
        if name == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        // Up to the unit tests (`#[cfg(test)] mod tests`): other items
        // for tests only, the simulator's hooks among them, count.
        let lines: Vec<&str> = text.lines().collect();
        let tests_at = lines
            .windows(2)
            .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod tests"))
            .unwrap_or(lines.len());
        let code: String = lines[..tests_at]
            .iter()
            .filter(|l| !l.trim_start().starts_with("//"))
            .copied()
            .collect::<Vec<_>>()
            .join("\n");
        out.insert(name, code);
    }
    out
}

/// The modules `code` names through `crate::`: the longest known prefix of
/// each path, in `use crate::{a, b::c}` groups too.
fn imports(code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut add = |path: &str| {
        let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
        for k in (1..=parts.len()).rev() {
            let candidate = parts[..k].join("::");
            if known.contains(&candidate) {
                found.insert(candidate);
                return;
            }
        }
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let path: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        let path = path.trim_end_matches(':');
        if rest[path.len()..].trim_start_matches(':').starts_with('{') {
            let group = &rest[rest.find('{').unwrap() + 1..];
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let item = item.split_whitespace().next().unwrap_or("");
                let full = if path.is_empty() { item.to_string() } else { format!("{path}::{item}") };
                add(&full);
            }
        } else {
            add(path);
        }
    }
    found
}

fn related(a: &str, b: &str) -> bool {
    a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
}

/// A cycle through `start`, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        at: &str,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(at).into_iter().flatten() {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if visit(graph, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    visit(graph, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn no_module_reaches_back_to_itself() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    assert!(modules.contains_key("vi") && modules.contains_key("transport::udp"), "{:?}", modules.keys());
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    let graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|(name, code)| {
            let deps = imports(code, &known).into_iter().filter(|d| d != name && !related(name, d)).collect();
            (name.clone(), deps)
        })
        .collect();
    // The graph is what the sources say: the VI uses both transports.
    assert!(graph["vi"].contains("transport::udp") && graph["vi"].contains("transport::shm"), "{graph:?}");
    for name in graph.keys() {
        if let Some(path) = cycle(&graph, name) {
            panic!("a module cycle: {} -> {name}", path.join(" -> "));
        }
    }
}

#[test]
fn the_check_sees_a_cycle() {
    let known: BTreeSet<String> = ["a", "b", "c::d"].iter().map(|s| s.to_string()).collect();
    assert_eq!(imports("use crate::{a, c::d::X};", &known), ["a", "c::d"].iter().map(|s| s.to_string()).collect());
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), imports("use crate::b::Thing;", &known)),
        ("b".to_string(), imports("fn f() { crate::a::g() }", &known)),
    ]
    .into_iter()
    .collect();
    assert_eq!(cycle(&graph, "a"), Some(vec!["a".to_string(), "b".to_string()]));
}
