//! Shared runtime of the provisioner services.
