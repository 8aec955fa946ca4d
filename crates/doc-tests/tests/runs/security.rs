//! docs/guide/src/security.md

use crate::blocks::security as b;
use crate::rt;

/// Mutual TLS with the CA and a client certificate.
pub fn tls() {
    rt().block_on(async {
        let files = testkit::TlsFiles::shared();
        let server = testkit::RedisServer::builder()
            .tls(files, testkit::ClientAuth::Yes)
            .start();
        b::tls::nightly(
            &server.tls_url().unwrap(),
            &files.ca_cert(),
            &files.client_cert(),
            &files.client_key(),
        )
        .await
        .unwrap();
    });
}
