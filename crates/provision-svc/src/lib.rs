//! provision-svc library.
