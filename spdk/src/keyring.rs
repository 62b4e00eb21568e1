//! SPDK's keyring, fed from memory: the DH-HMAC-CHAP secrets and TLS PSKs of exports and of
//! the initiator. Keys are added by name and referred to by name (host entries of a
//! subsystem, an initiator's attach); the secret itself never leaves this module in an error
//! or a log line, and no key file is written.

use std::ffi::CString;

use super::error::{Result, SpdkError, libc_errno};
use super::runtime::{cstr, on_reactor};

/// Check a key name: 1-128 characters of `[A-Za-z0-9._-]` (SPDK reserves `:` for keyring
/// prefixes, and the name goes into a JSON string for TLS).
pub(crate) fn check_name(field: &'static str, name: &str) -> Result<CString> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        return Err(SpdkError::InvalidArgument {
            field,
            reason: format!("{name:?} is not a key name (1-128 characters of A-Z a-z 0-9 . _ -)"),
        });
    }
    cstr(field, name)
}

/// The secret as a C string for SPDK; the error names neither the secret nor its content.
fn secret_cstr(name: &str, secret: &str) -> Result<CString> {
    let max = spdk_sys::LITEIO_KEY_MAX as usize;
    let printable = secret.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if secret.is_empty() || secret.len() >= max || !printable {
        return Err(SpdkError::InvalidArgument {
            field: "secret",
            reason: format!(
                "the secret of key {name:?} must be 1-{} printable ASCII characters without spaces",
                max - 1
            ),
        });
    }
    CString::new(secret).map_err(|_| SpdkError::InvalidArgument {
        field: "secret",
        reason: format!("the secret of key {name:?} contains a NUL byte"),
    })
}

/// Whether key `name` holds exactly `secret`; `None` when there is no such key. The key
/// material is read into a buffer that is wiped before returning.
///
/// # Safety
/// Must run on an SPDK thread (the keyring's users are there).
unsafe fn compare(name: &std::ffi::CStr, secret: &std::ffi::CStr) -> Option<bool> {
    let len = spdk_sys::LITEIO_KEY_MAX as usize;
    let mut out = vec![0u8; len];
    // SAFETY: the caller's contract; a key found is read into `out` (room for `len` bytes)
    // and put back.
    let same = unsafe {
        let k = spdk_sys::spdk_keyring_get_key(name.as_ptr());
        if k.is_null() {
            None
        } else {
            let got = spdk_sys::spdk_key_get_key(k, out.as_mut_ptr().cast(), len as i32);
            spdk_sys::spdk_keyring_put_key(k);
            Some(got >= 0 && out.get(..got as usize) == Some(secret.to_bytes()))
        }
    };
    out.fill(0);
    std::hint::black_box(&out);
    same
}

/// Overwrite a C string holding a secret before it is freed.
fn wipe(c: CString) {
    let mut bytes = c.into_bytes_with_nul();
    bytes.fill(0);
    std::hint::black_box(&bytes);
}

/// Add `secret` (a `DHHC-1:…:` secret or an `NVMeTLSkey-1:…:` PSK) as key `name`. SPDK checks
/// the format when the key is used. A key of that name with the same secret is success; with
/// another secret it is replaced: users holding the old one (a subsystem's host entry) keep it
/// until they are given the new one.
pub async fn add_key(name: &str, secret: &str) -> Result<()> {
    let n = check_name("name", name)?;
    let s = secret_cstr(name, secret)?;
    let name = name.to_string();
    on_reactor(move || {
        // SAFETY: on the reactor.
        let current = unsafe { compare(&n, &s) };
        let rc = match current {
            Some(true) => 0,
            // SAFETY: on the reactor; removes only a key of our module, then adds the new
            // secret (copied by the keyring).
            Some(false) => unsafe {
                match spdk_sys::liteio_keyring_remove(n.as_ptr()) {
                    0 => spdk_sys::liteio_keyring_add(n.as_ptr(), s.as_ptr()),
                    rc => rc,
                }
            },
            // SAFETY: on the reactor; both strings are valid and copied by the keyring.
            None => unsafe { spdk_sys::liteio_keyring_add(n.as_ptr(), s.as_ptr()) },
        };
        wipe(s);
        if rc != 0 {
            return Err(SpdkError::errno("add key", name, rc));
        }
        Ok(())
    })
    .await
}

/// Remove key `name`; missing is success. Users holding it keep it until they let go.
pub async fn remove_key(name: &str) -> Result<()> {
    let n = check_name("name", name)?;
    let name = name.to_string();
    on_reactor(move || {
        // SAFETY: on the reactor; `n` is valid. The lookup first: SPDK logs an error for a
        // missing key.
        if !unsafe { spdk_sys::liteio_keyring_has(n.as_ptr()) } {
            return Ok(());
        }
        // SAFETY: as above.
        let rc = unsafe { spdk_sys::liteio_keyring_remove(n.as_ptr()) };
        if rc != 0 && rc != -libc_errno::ENOKEY {
            return Err(SpdkError::errno("remove key", name, rc));
        }
        Ok(())
    })
    .await
}

/// Whether the keyring has key `name`.
pub async fn has_key(name: &str) -> Result<bool> {
    let n = check_name("name", name)?;
    // SAFETY: on the reactor; `n` is valid.
    on_reactor(move || Ok(unsafe { spdk_sys::liteio_keyring_has(n.as_ptr()) })).await
}

/// Whether key `name` holds exactly `secret` (false when there is no such key). Compares in
/// place: the key material is not handed out.
pub async fn holds(name: &str, secret: &str) -> Result<bool> {
    let n = check_name("name", name)?;
    let s = secret_cstr(name, secret)?;
    on_reactor(move || {
        // SAFETY: on the reactor.
        let same = unsafe { compare(&n, &s) }.unwrap_or(false);
        wipe(s);
        Ok(same)
    })
    .await
}
