//! reclaim-svc library.
