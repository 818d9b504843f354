//! The control plane's certificates: one CA that signs the API server's
//! serving certificate and every client certificate, and the service-account
//! signing key. All X.509 v3 (rustls refuses v1 client certificates).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use crate::Error;

pub struct Pki {
    dir: PathBuf,
    ca: Certificate,
    ca_key: KeyPair,
    pub ca_cert: PathBuf,
    pub ca_key_file: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub service_account_key: PathBuf,
    pub service_account_public_key: PathBuf,
}

/// A client certificate and its key, as files.
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn pki_error(what: &str, e: rcgen::Error) -> Error {
    Error::Pki(format!("{what}: {e}"))
}

impl Pki {
    pub fn create(dir: &Path) -> Result<Pki, Error> {
        std::fs::create_dir_all(dir)?;
        let ca_key = KeyPair::generate().map_err(|e| pki_error("CA key", e))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| pki_error("CA params", e))?;
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "controlplane-test-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = params
            .self_signed(&ca_key)
            .map_err(|e| pki_error("CA certificate", e))?;

        let serving_key = KeyPair::generate().map_err(|e| pki_error("serving key", e))?;
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "kubernetes".to_owned()])
                .map_err(|e| pki_error("serving params", e))?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving = params
            .signed_by(&serving_key, &ca, &ca_key)
            .map_err(|e| pki_error("serving certificate", e))?;

        let sa_key = KeyPair::generate().map_err(|e| pki_error("service-account key", e))?;

        let pki = Pki {
            dir: dir.to_owned(),
            ca_cert: dir.join("ca.crt"),
            ca_key_file: dir.join("ca.key"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            service_account_key: dir.join("sa.key"),
            service_account_public_key: dir.join("sa.pub"),
            ca,
            ca_key,
        };
        std::fs::write(&pki.ca_cert, pki.ca.pem())?;
        std::fs::write(&pki.ca_key_file, pki.ca_key.serialize_pem())?;
        std::fs::write(&pki.serving_cert, serving.pem())?;
        std::fs::write(&pki.serving_key, serving_key.serialize_pem())?;
        std::fs::write(&pki.service_account_key, sa_key.serialize_pem())?;
        std::fs::write(&pki.service_account_public_key, sa_key.public_key_pem())?;
        Ok(pki)
    }

    /// A client certificate for `user`, in `group` when given
    /// (`system:masters` is cluster-admin; any other name is an ordinary user
    /// for RBAC). One group at most: rcgen keeps one value per attribute.
    pub fn client(&self, user: &str, group: Option<&str>) -> Result<ClientCert, Error> {
        let key = KeyPair::generate().map_err(|e| pki_error("client key", e))?;
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| pki_error("client params", e))?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, user);
        if let Some(group) = group {
            params
                .distinguished_name
                .push(DnType::OrganizationName, group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .map_err(|e| pki_error("client certificate", e))?;
        let file = sanitize(user);
        let out = ClientCert {
            cert: self.dir.join(format!("user-{file}.crt")),
            key: self.dir.join(format!("user-{file}.key")),
        };
        std::fs::write(&out.cert, cert.pem())?;
        std::fs::write(&out.key, key.serialize_pem())?;
        Ok(out)
    }
}

/// A user name as a file name.
pub fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
