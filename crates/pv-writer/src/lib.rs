//! pv-writer library.
