//! The one TLS crypto provider of the process: rustls with *ring* (the database driver
//! uses it too). HTTP clients are built without a provider of their own, so it must be in
//! place before the first one; installing it twice is harmless.

/// Makes *ring* the process's rustls provider, if none is yet.
pub fn install_crypto_provider() {
    // An error means a provider is already installed, which is all we need.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
