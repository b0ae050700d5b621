//! Mutual challenge–response over a fresh connection: each side proves it
//! knows the job's secret with an HMAC-SHA256 over both sides' random
//! nonces, before anything else is read. The secret never crosses the wire.
//!
//! ```text
//!  server → client : nonce_s (16 B)
//!  client → server : nonce_c (16 B) ‖ HMAC(secret, "client" ‖ nonce_s ‖ nonce_c)
//!  server → client : HMAC(secret, "server" ‖ nonce_c ‖ nonce_s)
//! ```

use super::wire::io;
use crate::error::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{Read, Write};

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &[u8], role: &[u8], a: &[u8], b: &[u8]) -> Result<[u8; 32]> {
    let mut m = HmacSha256::new_from_slice(secret).map_err(|_| Error::internal("hmac key"))?;
    m.update(role);
    m.update(a);
    m.update(b);
    Ok(m.finalize().into_bytes().into())
}

fn verify(secret: &[u8], role: &[u8], a: &[u8], b: &[u8], tag: &[u8]) -> Result<()> {
    let mut m = HmacSha256::new_from_slice(secret).map_err(|_| Error::internal("hmac key"))?;
    m.update(role);
    m.update(a);
    m.update(b);
    m.verify_slice(tag).map_err(|_| Error::transport("peer failed to prove it knows the job secret"))
}

/// The accepting side.
pub fn server(s: &mut (impl Read + Write), secret: &[u8]) -> Result<()> {
    let nonce_s: [u8; 16] = rand::random();
    s.write_all(&nonce_s).map_err(io)?;
    let mut reply = [0u8; 48];
    s.read_exact(&mut reply).map_err(io)?;
    let (nonce_c, tag) = reply.split_at(16);
    verify(secret, b"client", &nonce_s, nonce_c, tag)?;
    s.write_all(&mac(secret, b"server", nonce_c, &nonce_s)?).map_err(io)?;
    s.flush().map_err(io)
}

/// The connecting side.
pub fn client(s: &mut (impl Read + Write), secret: &[u8]) -> Result<()> {
    let mut nonce_s = [0u8; 16];
    s.read_exact(&mut nonce_s).map_err(io)?;
    let nonce_c: [u8; 16] = rand::random();
    let mut reply = [0u8; 48];
    reply[..16].copy_from_slice(&nonce_c);
    reply[16..].copy_from_slice(&mac(secret, b"client", &nonce_s, &nonce_c)?);
    s.write_all(&reply).map_err(io)?;
    s.flush().map_err(io)?;
    let mut tag = [0u8; 32];
    s.read_exact(&mut tag).map_err(io)?;
    verify(secret, b"server", &nonce_c, &nonce_s, &tag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn pair(server_secret: [u8; 16], client_secret: [u8; 16]) -> (Result<()>, Result<()>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            server(&mut s, &server_secret)
        });
        let mut c = TcpStream::connect(addr).expect("connect");
        let rc = client(&mut c, &client_secret);
        drop(c);
        (t.join().expect("server thread"), rc)
    }

    #[test]
    fn same_secret_passes_other_secret_fails_both_ways() {
        let (s, c) = pair([7; 16], [7; 16]);
        assert!(s.is_ok() && c.is_ok());
        let (s, c) = pair([7; 16], [8; 16]);
        assert!(s.is_err(), "server rejects a client without the secret");
        assert!(c.is_err(), "client sees the connection refused");
    }
}
