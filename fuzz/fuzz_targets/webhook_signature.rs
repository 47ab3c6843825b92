//! Webhook signatures as a provider or an attacker sends them: any header
//! value under any scheme verifies or is refused without panicking, and
//! its refusal says the same whatever the secret (it cannot repeat it); a delivery signed with the secret
//! verifies, and the same delivery with one byte of its body changed, or
//! signed with another secret, or (Stripe) outside the tolerance, does not;
//! a bearer token verifies when it is the secret, and no other does.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use axum::http::{HeaderMap, HeaderValue};
use base64::Engine;
use libfuzzer_sys::fuzz_target;
use tidings_core::secret::Secret;
use tidings_inbox::signature::{
    AUTHORIZATION_HEADER, GITHUB_HEADER, STRIPE_HEADER, sign_hex, stripe_header, verify,
};
use tidings_inbox::{Encoding, Scheme, SignatureError};

#[derive(Debug, Arbitrary)]
struct Input {
    scheme: u8,
    secret: String,
    other_secret: String,
    body: Vec<u8>,
    /// Any header value, as an attacker sends it.
    forged: Vec<u8>,
    now: i64,
    skew: i32,
    flip: usize,
}

const TOLERANCE: u64 = 300;

fuzz_target!(|input: Input| {
    let scheme = match input.scheme % 5 {
        0 => Scheme::Stripe {
            tolerance: Duration::from_secs(TOLERANCE),
        },
        1 => Scheme::GitHub,
        2 => Scheme::Hmac {
            header: "x-signature".into(),
            encoding: Encoding::Hex,
        },
        3 => Scheme::Hmac {
            header: "x-signature".into(),
            encoding: Encoding::Base64,
        },
        _ => Scheme::Bearer,
    };
    let bearer = scheme == Scheme::Bearer;
    let header = match &scheme {
        Scheme::Stripe { .. } => STRIPE_HEADER,
        Scheme::GitHub => GITHUB_HEADER,
        Scheme::Hmac { .. } => "x-signature",
        Scheme::Bearer => AUTHORIZATION_HEADER,
    };
    // A token travels in a header as it is: visible ASCII.
    let token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
    if input.secret.is_empty() || (bearer && !token(&input.secret)) {
        return;
    }
    let secret = Secret::new(input.secret.clone());
    let secrets = [secret.clone()];
    let now = input.now / 4; // far from overflow when skewed

    // Anything forged: refused or (by chance) verified, never a panic, and
    // never the secret in the refusal.
    if let Ok(value) = HeaderValue::from_bytes(&input.forged) {
        let mut headers = HeaderMap::new();
        headers.insert(header, value);
        let unrelated = [Secret::new("an unrelated secret")];
        if let (Err(ours), Err(theirs)) = (
            verify(&scheme, &secrets, &headers, &input.body, now),
            verify(&scheme, &unrelated, &headers, &input.body, now),
        ) {
            assert_eq!(
                ours.to_string(),
                theirs.to_string(),
                "the refusal depends on the secret"
            );
        }
    }

    // Signed as the provider signs.
    let sign = |secret: &Secret, body: &[u8], at: i64| -> String {
        match &scheme {
            Scheme::Stripe { .. } => stripe_header(secret, at, body),
            Scheme::GitHub => format!("sha256={}", sign_hex(secret, &[body])),
            Scheme::Hmac {
                encoding: Encoding::Hex,
                ..
            } => sign_hex(secret, &[body]),
            Scheme::Hmac { .. } => base64::engine::general_purpose::STANDARD
                .encode(hex::decode(sign_hex(secret, &[body])).unwrap()),
            Scheme::Bearer => format!("Bearer {}", secret.expose()),
        }
    };
    let with = |value: String| {
        let mut headers = HeaderMap::new();
        headers.insert(header, HeaderValue::from_str(&value).unwrap());
        headers
    };
    let signed = with(sign(&secret, &input.body, now));
    assert_eq!(verify(&scheme, &secrets, &signed, &input.body, now), Ok(()));

    if !input.body.is_empty() && !bearer {
        let mut changed = input.body.clone();
        let at = input.flip % changed.len();
        changed[at] ^= 0x01;
        assert_eq!(
            verify(&scheme, &secrets, &signed, &changed, now),
            Err(SignatureError::Mismatch)
        );
    }
    // HMAC pads its key with zeros: `k` and `k\0` are one key, not two.
    let key = |s: &str| s.trim_end_matches('\0').to_owned();
    let other = if bearer {
        token(&input.other_secret) && input.other_secret != input.secret
    } else {
        key(&input.other_secret) != key(&input.secret) && !input.other_secret.is_empty()
    };
    if other {
        let forged = with(sign(&Secret::new(input.other_secret.clone()), &input.body, now));
        let expected = if bearer {
            SignatureError::WrongToken
        } else {
            SignatureError::Mismatch
        };
        assert_eq!(
            verify(&scheme, &secrets, &forged, &input.body, now),
            Err(expected)
        );
    }
    if let Scheme::Stripe { .. } = scheme {
        let at = now + i64::from(input.skew);
        let headers = with(sign(&secret, &input.body, at));
        let verdict = verify(&scheme, &secrets, &headers, &input.body, now);
        if u64::from(input.skew.unsigned_abs()) > TOLERANCE {
            assert!(
                matches!(verdict, Err(SignatureError::Stale { .. })),
                "{verdict:?}"
            );
        } else {
            assert_eq!(verdict, Ok(()));
        }
    }
});
