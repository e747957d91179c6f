//! Built-in storage backends.

pub mod hostpath;
