//! Built-in storage backends, and the `--backend` flag that picks one.
//!
//! * [`hostpath`] — a directory per volume on one node (`hostPath` PVs);
//! * [`nfs_subdir`] — a sub-directory per volume of one NFS export (`nfs`
//!   PVs), a drop-in replacement for nfs-subdir-external-provisioner;
//! * [`select`] — [`select::BackendArgs`], shared by the services' command lines.

pub mod hostpath;
pub mod nfs_subdir;
pub mod select;
