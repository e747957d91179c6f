//! Owner and permissions of a new volume directory: the StorageClass parameters
//! `directoryMode`, `directoryUID`, `directoryGID` (every filesystem backend), with per-claim
//! overrides where a backend has them (nfs-subdir's `nfs.io/create*` annotations).

use std::collections::BTreeMap;
use std::io;

use crate::safe_fs::{self, Dir};
use crate::Refusal;

/// StorageClass parameter: octal permission bits of a new volume directory (default `0777`).
pub const PARAM_DIRECTORY_MODE: &str = "directoryMode";
/// StorageClass parameter: numeric owner of a new volume directory (default: the service's).
pub const PARAM_DIRECTORY_UID: &str = "directoryUID";
/// StorageClass parameter: numeric group of a new volume directory (default: the service's).
pub const PARAM_DIRECTORY_GID: &str = "directoryGID";
/// Owner and permissions of a new volume directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirAttrs {
    /// Permission bits (at most `0o7777`).
    pub mode: u32,
    /// Owner, when set.
    pub uid: Option<u32>,
    /// Group, when set.
    pub gid: Option<u32>,
}

impl Default for DirAttrs {
    /// World-writable (`0777`), owner unchanged: a pod running as any user can write.
    fn default() -> Self {
        DirAttrs {
            mode: 0o777,
            uid: None,
            gid: None,
        }
    }
}

impl DirAttrs {
    /// The class's `directoryMode`/`directoryUID`/`directoryGID` over the defaults.
    /// Errors: as [`DirAttrs::overridden`].
    pub fn from_class(parameters: Option<&BTreeMap<String, String>>) -> Result<Self, Refusal> {
        let keys = [
            PARAM_DIRECTORY_MODE,
            PARAM_DIRECTORY_UID,
            PARAM_DIRECTORY_GID,
        ];
        Self::default().overridden(parameters, keys, "StorageClass parameter")
    }

    /// `self` with the values `values` holds under `keys` (mode, uid, gid); `source` names
    /// them in errors. Errors: a mode that is not octal `0`–`7777`, an id that is not a
    /// decimal `u32`; the message names the key and the value.
    pub fn overridden(
        self,
        values: Option<&BTreeMap<String, String>>,
        [mode_key, uid_key, gid_key]: [&str; 3],
        source: &str,
    ) -> Result<Self, Refusal> {
        let get = |k: &str| values.and_then(|a| a.get(k)).map(|v| v.trim());
        let mode = match get(mode_key) {
            None => self.mode,
            Some(v) => {
                let digits = v.strip_prefix("0o").unwrap_or(v);
                let mode = u32::from_str_radix(digits, 8).ok();
                mode.filter(|m| !digits.starts_with('+') && *m <= 0o7777)
                    .ok_or_else(|| {
                        Refusal(format!(
                            "{source} {mode_key}={v:?} is not an octal permission mode (0-7777)"
                        ))
                    })?
            }
        };
        // Decimal digits only (`u32`'s parser also takes a leading `+`).
        let id = |k: &str, current: Option<u32>| match get(k) {
            None => Ok(current),
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|_| v.bytes().all(|b| b.is_ascii_digit()))
                .map(Some)
                .ok_or_else(|| Refusal(format!("{source} {k}={v:?} is not a numeric id"))),
        };
        Ok(DirAttrs {
            mode,
            uid: id(uid_key, self.uid)?,
            gid: id(gid_key, self.gid)?,
        })
    }

    /// Set the mode (not subject to the umask) and, when given, owner and group of `dir`.
    /// Errors: `fchmod`/`fchown` failed.
    pub fn apply(&self, dir: &Dir) -> io::Result<()> {
        safe_fs::set_mode(dir, self.mode)?;
        if self.uid.is_some() || self.gid.is_some() {
            std::os::unix::fs::fchown(safe_fs::as_file(dir)?, self.uid, self.gid)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn class_parameters_then_overrides() {
        assert_eq!(DirAttrs::from_class(None), Ok(DirAttrs::default()));
        let class = values(&[("directoryMode", "0750"), ("directoryUID", "1000")]);
        let attrs = DirAttrs::from_class(Some(&class)).unwrap();
        assert_eq!(
            attrs,
            DirAttrs {
                mode: 0o750,
                uid: Some(1000),
                gid: None
            }
        );
        let claim = values(&[("m", "0o700"), ("g", "2000")]);
        let over = attrs
            .overridden(Some(&claim), ["m", "u", "g"], "claim annotation")
            .unwrap();
        assert_eq!(
            over,
            DirAttrs {
                mode: 0o700,
                uid: Some(1000),
                gid: Some(2000)
            }
        );
    }

    #[test]
    fn bad_values_are_refused_with_their_key() {
        for (key, value, expected) in [
            ("directoryMode", "0999", "StorageClass parameter directoryMode=\"0999\" is not an octal permission mode (0-7777)"),
            ("directoryMode", "17777", "is not an octal permission mode"),
            ("directoryMode", "+7", "is not an octal permission mode"),
            ("directoryUID", "-1", "StorageClass parameter directoryUID=\"-1\" is not a numeric id"),
            ("directoryGID", "99999999999", "directoryGID=\"99999999999\" is not a numeric id"),
        ] {
            let err = DirAttrs::from_class(Some(&values(&[(key, value)]))).unwrap_err();
            assert!(err.0.contains(expected), "{key}={value}: {err}");
        }
    }
}
