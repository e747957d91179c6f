//! Certificates and keys of a [`RealCluster`](super::RealCluster), generated
//! with the `rcgen` crate (no `openssl` process): a self-signed CA, a serving
//! certificate for `127.0.0.1`/`localhost` signed by it (used by
//! kube-apiserver), and an ECDSA P-256 key pair that signs and verifies
//! service-account tokens (kube-apiserver and kube-controller-manager accept
//! ECDSA keys for `--service-account-*-key-file` as well as RSA).
//!
//! All keys are ECDSA P-256, PEM-encoded (private keys as PKCS#8
//! `PRIVATE KEY`, public keys as PKIX `PUBLIC KEY`). Validity is rcgen's
//! default (1975 to 4096), so a kept directory stays usable.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};

/// Paths of the files [`generate`] wrote (all inside one `pki/` folder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pki {
    /// CA certificate (`ca.crt`): `--client-ca-file`, `--root-ca-file`, clients' trust root.
    pub ca_cert: PathBuf,
    /// CA private key (`ca.key`): the controller manager's `--cluster-signing-key-file`.
    pub ca_key: PathBuf,
    /// kube-apiserver serving certificate (`apiserver.crt`) for `127.0.0.1` and `localhost`.
    pub serving_cert: PathBuf,
    /// Its private key (`apiserver.key`).
    pub serving_key: PathBuf,
    /// Service-account token signing key (`sa.key`).
    pub sa_key: PathBuf,
    /// Its public key (`sa.pub`): the API server's `--service-account-key-file`.
    pub sa_pub: PathBuf,
    /// Client certificate and key of the node's kubelet (`kubelet.crt`, `kubelet.key`):
    /// user `system:node:node-1`, group `system:nodes` (see [`NODE_NAME`]).
    pub kubelet: (PathBuf, PathBuf),
    /// Client certificate and key of kube-proxy (`kube-proxy.crt`, `kube-proxy.key`):
    /// user `system:kube-proxy`.
    pub kube_proxy: (PathBuf, PathBuf),
}

/// The one node's name in a cluster with a real node (`realkube::node`).
pub const NODE_NAME: &str = "node-1";

/// Sign a client certificate for `cn` in groups `orgs` with `issuer`; write it and its key.
fn client_cert(
    issuer: &Issuer<'_, KeyPair>,
    cn: &str,
    orgs: &[&str],
    (cert_path, key_path): &(PathBuf, PathBuf),
) -> anyhow::Result<()> {
    let key = new_key()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, cn);
    for org in orgs {
        params
            .distinguished_name
            .push(DnType::OrganizationName, *org);
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    let cert = params
        .signed_by(&key, issuer)
        .with_context(|| format!("signing the client certificate of {cn}"))?;
    std::fs::write(cert_path, cert.pem())?;
    write_private(key_path, &key.serialize_pem())
}

fn new_key() -> anyhow::Result<KeyPair> {
    KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("generating an ECDSA P-256 key")
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// Generate the CA, the serving certificate and the service-account key pair
/// into `dir` (created if missing).
///
/// Errors: key generation or signing fails, or a file cannot be written.
pub fn generate(dir: &Path) -> anyhow::Result<Pki> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let pki = Pki {
        ca_cert: dir.join("ca.crt"),
        ca_key: dir.join("ca.key"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
        kubelet: (dir.join("kubelet.crt"), dir.join("kubelet.key")),
        kube_proxy: (dir.join("kube-proxy.crt"), dir.join("kube-proxy.key")),
    };

    let ca_key = new_key()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "e2e-realkube-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .context("self-signing the CA")?;
    std::fs::write(&pki.ca_cert, ca_cert.pem())?;
    write_private(&pki.ca_key, &ca_key.serialize_pem())?;
    let issuer = Issuer::new(ca_params, ca_key);

    let serving_key = new_key()?;
    let mut params = CertificateParams::new(vec![
        "127.0.0.1".to_string(),
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default.svc".to_string(),
        "kubernetes.default.svc.cluster.local".to_string(),
        // The `kubernetes` Service's cluster IP (first of 10.0.0.0/24), for pods on a real node.
        "10.0.0.1".to_string(),
    ])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let serving = params
        .signed_by(&serving_key, &issuer)
        .context("signing the serving certificate")?;
    std::fs::write(&pki.serving_cert, serving.pem())?;
    write_private(&pki.serving_key, &serving_key.serialize_pem())?;

    client_cert(
        &issuer,
        &format!("system:node:{NODE_NAME}"),
        &["system:nodes"],
        &pki.kubelet,
    )?;
    client_cert(&issuer, "system:kube-proxy", &[], &pki.kube_proxy)?;

    let sa_key = new_key()?;
    write_private(&pki.sa_key, &sa_key.serialize_pem())?;
    std::fs::write(&pki.sa_pub, sa_key.public_key_pem())?;
    Ok(pki)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_pem_files_with_private_keys_unreadable_by_others() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let pki = generate(dir.path()).unwrap();
        let ca = std::fs::read_to_string(&pki.ca_cert).unwrap();
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
        let sa = std::fs::read_to_string(&pki.sa_pub).unwrap();
        assert!(sa.starts_with("-----BEGIN PUBLIC KEY-----"), "{sa}");
        for key in [&pki.ca_key, &pki.serving_key, &pki.sa_key] {
            let text = std::fs::read_to_string(key).unwrap();
            assert!(text.starts_with("-----BEGIN PRIVATE KEY-----"), "{text}");
            let mode = std::fs::metadata(key).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{} mode {mode:o}", key.display());
        }
    }
}
