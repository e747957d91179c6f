//! The volume directory's name: upstream's default
//! `<namespace>-<claim name>-<pv name>` or the class's `pathPattern` with
//! `${.PVC.namespace}`, `${.PVC.name}`, `${.PVC.labels.KEY}`,
//! `${.PVC.annotations.KEY}` and `${.PV.name}`; `/` nests, empty and `.`
//! components drop, an empty result falls back to the default. Whatever upstream
//! fills in silently (a missing key, an unknown placeholder, `..`, an absolute
//! path) is refused, so a rendered path only names a directory strictly inside
//! the mount.

use backend_kit::Refusal;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

/// A checked relative path below the mount: at least one component, each a
/// plain name (not empty, not `.`/`..`, no `/` or NUL, at most 255 bytes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath(Vec<String>);

impl RelPath {
    /// Parse `text` (`/`-separated; empty and `.` components dropped). Errors:
    /// absolute, `..`, NUL, a component over 255 bytes, the bookkeeping directory, empty.
    pub fn parse(text: &str) -> Result<RelPath, Refusal> {
        if text.starts_with('/') {
            return Err(Refusal(format!("{text:?} is an absolute path")));
        }
        if text.contains('\0') {
            return Err(Refusal(format!("{text:?} contains a NUL byte")));
        }
        let mut comps = Vec::new();
        for c in text.split('/') {
            match c {
                "" | "." => continue,
                ".." => return Err(Refusal(format!("{text:?} contains a \"..\" component"))),
                c if c.len() > 255 => {
                    return Err(Refusal(format!(
                        "{text:?} has a component longer than 255 bytes"
                    )))
                }
                c => comps.push(c.to_string()),
            }
        }
        if comps.is_empty() {
            return Err(Refusal(format!(
                "{text:?} names no directory below the mount"
            )));
        }
        if comps[0] == super::registry::REGISTRY_DIR {
            return Err(Refusal(format!(
                "{text:?} is inside the backend's bookkeeping directory {:?}",
                super::registry::REGISTRY_DIR
            )));
        }
        Ok(RelPath(comps))
    }

    /// The components, outermost first (never empty).
    pub fn components(&self) -> &[String] {
        &self.0
    }

    /// (parent components, last component).
    pub fn split_last(&self) -> (&[String], &str) {
        let (last, parent) = self.0.split_last().expect("RelPath is never empty");
        (parent, last.as_str())
    }

    /// Whether `other` lies strictly below this path (component-wise).
    pub fn contains(&self, other: &RelPath) -> bool {
        other.0.len() > self.0.len() && other.0[..self.0.len()] == self.0[..]
    }

    /// Whether the two paths are equal or one lies below the other.
    pub fn overlaps(&self, other: &RelPath) -> bool {
        self == other || self.contains(other) || other.contains(self)
    }
}

impl std::fmt::Display for RelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("/"))
    }
}

/// The volume directory of the claim `claim` (its metadata) for `pv_name`: `pattern`
/// rendered, else upstream's default `<namespace>-<claim name>-<pv name>`.
/// Errors: an unknown placeholder, a missing key, `${` unterminated, or a bad path.
pub fn volume_path(
    pattern: Option<&str>,
    claim: &ObjectMeta,
    pv_name: &str,
) -> Result<RelPath, Refusal> {
    let rendered = pattern.map(|p| render(p, claim, pv_name)).transpose()?;
    let rendered = rendered.unwrap_or_default();
    if rendered.split('/').all(|c| c.is_empty() || c == ".") {
        let namespace = claim.namespace.as_deref().unwrap_or_default();
        let name = claim.name.as_deref().unwrap_or_default();
        return RelPath::parse(&format!("{namespace}-{name}-{pv_name}"))
            .map_err(|e| Refusal(format!("default directory name {e}")));
    }
    RelPath::parse(&rendered).map_err(|e| Refusal(format!("pathPattern renders to {e}")))
}

/// Substitute every placeholder of `pattern`. Errors: see [`volume_path`].
pub fn render(pattern: &str, claim: &ObjectMeta, pv_name: &str) -> Result<String, Refusal> {
    let mut out = String::with_capacity(pattern.len());
    let mut rest = pattern;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| {
            Refusal(format!(
                "pathPattern {pattern:?} has an unterminated \"${{\""
            ))
        })?;
        let key = &after[..end];
        out.push_str(&lookup(key, claim, pv_name)?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn lookup(key: &str, claim: &ObjectMeta, pv_name: &str) -> Result<String, Refusal> {
    let from_map = |what: &str, map: Option<&BTreeMap<String, String>>, k: &str| {
        let value = map.and_then(|m| m.get(k)).ok_or_else(|| {
            Refusal(format!(
                "pathPattern uses the claim's {what} {k:?}, which the claim does not have"
            ))
        })?;
        if value.is_empty() {
            return Err(Refusal(format!(
                "the claim's {what} {k:?} used by pathPattern is empty"
            )));
        }
        if value.starts_with('/') || value.contains('\0') || value.split('/').any(|c| c == "..") {
            return Err(Refusal(format!(
                "the claim's {what} {k:?} = {value:?} used by pathPattern is absolute or contains \"..\" or a NUL byte"
            )));
        }
        Ok(value.clone())
    };
    let label = key.strip_prefix(".PVC.labels.");
    let annotation = key.strip_prefix(".PVC.annotations.");
    match (key, label, annotation) {
        (".PVC.namespace", ..) => Ok(claim.namespace.clone().unwrap_or_default()),
        (".PVC.name", ..) => Ok(claim.name.clone().unwrap_or_default()),
        (".PV.name", ..) => Ok(pv_name.to_string()),
        (_, Some(label), _) => from_map("label", claim.labels.as_ref(), label),
        (_, _, Some(ann)) => from_map("annotation", claim.annotations.as_ref(), ann),
        (k, ..) => Err(Refusal(format!(
            "pathPattern placeholder \"${{{k}}}\" is unknown (known: ${{.PVC.namespace}}, ${{.PVC.name}}, ${{.PVC.labels.KEY}}, ${{.PVC.annotations.KEY}}, ${{.PV.name}})"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> ObjectMeta {
        ObjectMeta {
            namespace: Some("team-a".into()),
            name: Some("data".into()),
            labels: Some(labels.clone()),
            annotations: Some(annotations.clone()),
            ..Default::default()
        }
    }

    fn path(pattern: Option<&str>, claim: &ObjectMeta) -> Result<RelPath, Refusal> {
        volume_path(pattern, claim, "pvc-1")
    }

    fn maps() -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        (
            BTreeMap::from([("app".to_string(), "web".to_string())]),
            BTreeMap::from([
                ("owner".to_string(), "alice".to_string()),
                ("nested".to_string(), "x/y".to_string()),
                ("up".to_string(), "../etc".to_string()),
                ("abs".to_string(), "/etc".to_string()),
                ("blank".to_string(), String::new()),
            ]),
        )
    }

    #[test]
    fn default_is_namespace_claim_pv() {
        let (l, a) = maps();
        assert_eq!(
            path(None, &input(&l, &a)).unwrap().to_string(),
            "team-a-data-pvc-1"
        );
        // A pattern that renders to nothing falls back to the default, as upstream.
        for empty in ["", "/", "./", "//."] {
            assert_eq!(
                path(Some(empty), &input(&l, &a)).unwrap().to_string(),
                "team-a-data-pvc-1",
                "{empty:?}"
            );
        }
    }

    #[test]
    fn every_placeholder_renders() {
        let (l, a) = maps();
        let p = "${.PVC.namespace}/${.PVC.labels.app}/${.PVC.annotations.owner}-${.PVC.name}/${.PV.name}";
        assert_eq!(
            path(Some(p), &input(&l, &a)).unwrap().components(),
            ["team-a", "web", "alice-data", "pvc-1"]
        );
        // Interior slashes of an annotation nest; doubled slashes and `.` collapse.
        assert_eq!(
            path(Some("./${.PVC.annotations.nested}//z/"), &input(&l, &a))
                .unwrap()
                .to_string(),
            "x/y/z"
        );
        // Text without placeholders is used verbatim.
        assert_eq!(
            path(Some("static/dir"), &input(&l, &a))
                .unwrap()
                .to_string(),
            "static/dir"
        );
    }

    #[test]
    fn refusals() {
        let (l, a) = maps();
        let cases = [
            ("${.PVC.labels.missing}", "which the claim does not have"),
            (
                "${.PVC.annotations.missing}",
                "which the claim does not have",
            ),
            ("${.PVC.annotations.blank}", "is empty"),
            ("${.PVC.annotations.up}", "contains \"..\""),
            ("${.PVC.annotations.abs}", "is absolute"),
            ("${.PVC.nmae}", "is unknown"),
            ("${.PVC.name", "unterminated"),
            ("/abs/${.PVC.name}", "is an absolute path"),
            ("a/../../b", "contains a \"..\" component"),
            ("..", "contains a \"..\" component"),
            (".split-provisioner/x", "bookkeeping directory"),
        ];
        for (pattern, expected) in cases {
            let err = path(Some(pattern), &input(&l, &a)).unwrap_err().0;
            assert!(err.contains(expected), "{pattern:?}: {err}");
        }
        let long = "a".repeat(256);
        assert!(path(Some(&long), &input(&l, &a))
            .unwrap_err()
            .0
            .contains("longer than 255"));
        assert!(RelPath::parse("a\0b").unwrap_err().0.contains("NUL"));
        // No labels at all is the same as a missing label.
        let none = ObjectMeta {
            labels: None,
            ..input(&l, &a)
        };
        assert!(path(Some("${.PVC.labels.app}"), &none).is_err());
    }
}
