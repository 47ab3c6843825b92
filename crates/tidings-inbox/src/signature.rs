//! Webhook signatures: Stripe's, GitHub's and a generic HMAC header, all
//! HMAC-SHA256, and a bearer token, each compared in constant time.
//!
//! [`verify`] is pure (the clock is a parameter), so it can be tested and
//! fuzzed without a server. Its errors say what was wrong without ever
//! repeating a signature or a secret.

use std::fmt;
use std::time::Duration;

use axum::http::HeaderMap;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tidings_core::secret::Secret;

type HmacSha256 = Hmac<Sha256>;

/// How a provider signs its deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    /// Stripe: `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=...]`, the
    /// HMAC of `<t>.<body>`. A timestamp further than `tolerance` from this
    /// server's clock, in the past or the future, is refused: a captured
    /// delivery cannot be replayed later.
    Stripe {
        /// How far the signature's timestamp may be from now (Stripe's
        /// libraries use five minutes).
        tolerance: Duration,
    },
    /// GitHub: `X-Hub-Signature-256: sha256=<hex>`, the HMAC of the body.
    GitHub,
    /// Any provider that sends the HMAC of the body in one header, in hex
    /// or base64, with or without a `sha256=` prefix.
    Hmac {
        /// The header's name (`X-Signature`), in any case.
        header: String,
        /// How the signature is written.
        encoding: Encoding,
    },
    /// A shared token: `Authorization: Bearer <token>`, as services
    /// delivering CloudEvents over HTTP authenticate (the body is not
    /// signed: serve it over TLS).
    Bearer,
}

/// How a generic HMAC signature is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Hexadecimal, either case.
    #[default]
    Hex,
    /// Standard base64, with padding.
    Base64,
}

/// The header Stripe signs with.
pub const STRIPE_HEADER: &str = "stripe-signature";
/// The header GitHub signs with (SHA-256).
pub const GITHUB_HEADER: &str = "x-hub-signature-256";
/// The header a bearer token comes in.
pub const AUTHORIZATION_HEADER: &str = "authorization";

/// Why a delivery's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureError {
    /// The signature header is absent.
    Missing {
        /// The header expected.
        header: String,
    },
    /// The header does not read as the scheme writes it.
    Malformed {
        /// The header.
        header: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Stripe's timestamp is too far from this server's clock.
    Stale {
        /// How far, in seconds.
        off_by: u64,
        /// The tolerance, in seconds.
        tolerance: u64,
    },
    /// No signature matches the body under any of the provider's secrets.
    Mismatch,
    /// The bearer token is none of the provider's secrets.
    WrongToken,
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignatureError::Missing { header } => write!(f, "the delivery has no {header} header"),
            SignatureError::Malformed { header, reason } => write!(f, "the {header} header is malformed: {reason}"),
            SignatureError::Stale { off_by, tolerance } => write!(
                f,
                "the signature's timestamp is {off_by} s away from this server's clock, more than the \
                 {tolerance} s tolerance (a replayed delivery, or a clock out of sync)"
            ),
            SignatureError::Mismatch => f.write_str(
                "no signature matches the body: the secret is not the provider's, or the body was changed on the way",
            ),
            SignatureError::WrongToken => f.write_str("the bearer token is not one this inbox accepts"),
        }
    }
}

impl std::error::Error for SignatureError {}

/// Checks that `body` was signed by one of `secrets` under `scheme`, from
/// the delivery's `headers`, at `now` (Unix seconds).
///
/// Several secrets serve a rotation: the old and the new one are both
/// accepted until the provider uses only the new one.
pub fn verify(
    scheme: &Scheme,
    secrets: &[Secret],
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<(), SignatureError> {
    match scheme {
        Scheme::Stripe { tolerance } => {
            let value = header(headers, STRIPE_HEADER)?;
            let (timestamp, written, signatures) = stripe_parts(value)?;
            let tolerance = tolerance.as_secs();
            let off_by = now.abs_diff(timestamp);
            if off_by > tolerance {
                return Err(SignatureError::Stale { off_by, tolerance });
            }
            // Signed as written (`t=0123` too), as Stripe's libraries do.
            matches_any(secrets, &[written.as_bytes(), b".", body], &signatures)
        }
        Scheme::GitHub => {
            let value = header(headers, GITHUB_HEADER)?;
            let hex = value.strip_prefix("sha256=").ok_or(SignatureError::Malformed {
                header: GITHUB_HEADER.into(),
                reason: "it does not start with sha256=",
            })?;
            let signature = decode(hex, Encoding::Hex, GITHUB_HEADER)?;
            matches_any(secrets, &[body], &[signature])
        }
        Scheme::Hmac {
            header: name,
            encoding,
        } => {
            let value = header(headers, name)?;
            let value = value.strip_prefix("sha256=").unwrap_or(value);
            let signature = decode(value, *encoding, name)?;
            matches_any(secrets, &[body], &[signature])
        }
        Scheme::Bearer => {
            let value = header(headers, AUTHORIZATION_HEADER)?;
            let token = value
                .get(..7)
                .filter(|scheme| scheme.eq_ignore_ascii_case("bearer "))
                .map(|_| value[7..].trim())
                .ok_or(SignatureError::Malformed {
                    header: AUTHORIZATION_HEADER.into(),
                    reason: "it is not `Bearer <token>`",
                })?;
            token_matches(secrets, token)
        }
    }
}

/// Whether `token` is one of `secrets`, compared in constant time: as
/// HMACs of a fixed key, so that neither the contents nor the length of a
/// secret shows in the time taken.
fn token_matches(secrets: &[Secret], token: &str) -> Result<(), SignatureError> {
    let tag = |bytes: &[u8]| {
        let mut mac = HmacSha256::new_from_slice(b"tidings-inbox bearer token").expect("a fixed key");
        mac.update(bytes);
        mac
    };
    let expected = tag(token.as_bytes());
    for secret in secrets {
        let secret_tag = tag(secret.expose().as_bytes()).finalize().into_bytes();
        if expected.clone().verify_slice(&secret_tag).is_ok() {
            return Ok(());
        }
    }
    Err(SignatureError::WrongToken)
}

/// The header `name` as text.
fn header<'h>(headers: &'h HeaderMap, name: &str) -> Result<&'h str, SignatureError> {
    let value = headers.get(name).ok_or_else(|| SignatureError::Missing {
        header: name.to_owned(),
    })?;
    value
        .to_str()
        .map(str::trim)
        .map_err(|_| SignatureError::Malformed {
            header: name.to_owned(),
            reason: "it is not visible ASCII",
        })
}

/// Stripe's timestamp and its `v1` signatures. Other schemes (`v0`) are
/// ignored, as Stripe's libraries ignore them.
fn stripe_parts(value: &str) -> Result<(i64, &str, Vec<Vec<u8>>), SignatureError> {
    let malformed = |reason| SignatureError::Malformed {
        header: STRIPE_HEADER.into(),
        reason,
    };
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for item in value.split(',') {
        let Some((name, value)) = item.trim().split_once('=') else {
            return Err(malformed("an item is not name=value"));
        };
        match name {
            "t" => {
                let t = value
                    .parse::<i64>()
                    .map_err(|_| malformed("t is not a Unix time"))?;
                if timestamp.replace((t, value)).is_some() {
                    return Err(malformed("t is given twice"));
                }
            }
            // A v1 that is not hex cannot match: skip it, as if absent.
            "v1" => signatures.extend(hex::decode(value).ok()),
            _ => {}
        }
    }
    let (timestamp, written) = timestamp.ok_or_else(|| malformed("it has no timestamp (t=)"))?;
    if signatures.is_empty() {
        return Err(malformed("it has no v1 signature"));
    }
    Ok((timestamp, written, signatures))
}

/// `value` decoded as `encoding`.
fn decode(value: &str, encoding: Encoding, header: &str) -> Result<Vec<u8>, SignatureError> {
    let decoded = match encoding {
        Encoding::Hex => hex::decode(value).ok(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.decode(value).ok(),
    };
    decoded.ok_or_else(|| SignatureError::Malformed {
        header: header.to_owned(),
        reason: match encoding {
            Encoding::Hex => "the signature is not hexadecimal",
            Encoding::Base64 => "the signature is not base64",
        },
    })
}

/// Whether one of `signatures` is the HMAC of the concatenated `parts`
/// under one of `secrets`. Every comparison is constant-time.
fn matches_any(secrets: &[Secret], parts: &[&[u8]], signatures: &[Vec<u8>]) -> Result<(), SignatureError> {
    for secret in secrets {
        let mut mac =
            HmacSha256::new_from_slice(secret.expose().as_bytes()).expect("HMAC takes keys of any length");
        for part in parts {
            mac.update(part);
        }
        for signature in signatures {
            if mac.clone().verify_slice(signature).is_ok() {
                return Ok(());
            }
        }
    }
    Err(SignatureError::Mismatch)
}

/// The HMAC-SHA256 of the concatenated `parts` under `secret`, in hex:
/// what a provider sends, for tests and for signing deliveries to replay.
pub fn sign_hex(secret: &Secret, parts: &[&[u8]]) -> String {
    let mut mac =
        HmacSha256::new_from_slice(secret.expose().as_bytes()).expect("HMAC takes keys of any length");
    for part in parts {
        mac.update(part);
    }
    hex::encode(mac.finalize().into_bytes())
}

/// The SHA-256 of `bytes`, in hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(Sha256::digest(bytes))
}

/// A `Stripe-Signature` value for `body` at `timestamp`, as Stripe writes it.
pub fn stripe_header(secret: &Secret, timestamp: i64, body: &[u8]) -> String {
    let prefix = format!("{timestamp}.");
    format!(
        "t={timestamp},v1={}",
        sign_hex(secret, &[prefix.as_bytes(), body])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, value.parse().unwrap());
        h
    }

    const STRIPE: Scheme = Scheme::Stripe {
        tolerance: Duration::from_secs(300),
    };

    #[test]
    fn stripe_signatures_match_an_independent_implementation() {
        // Computed with Python's hmac module: hmac.new(b"whsec_test",
        // b'1700000000.{"id":"evt_1"}', hashlib.sha256).hexdigest().
        let secret = Secret::new("whsec_test");
        let body = br#"{"id":"evt_1"}"#;
        let expected = "t=1700000000,v1=c89214b5b5da833daed6f0b8c5bb6bd58cea9022bd80ccc78230f3942d632925";
        let ours = stripe_header(&secret, 1_700_000_000, body);
        assert_eq!(ours, expected);
        let h = headers(STRIPE_HEADER, &ours);
        assert_eq!(verify(&STRIPE, &[secret], &h, body, 1_700_000_100), Ok(()));
    }

    #[test]
    fn stripe_refuses_a_changed_body_a_stale_or_future_timestamp_and_a_wrong_secret() {
        let secret = Secret::new("whsec_a");
        let body = br#"{"id":"evt_1","amount":100}"#;
        let h = headers(STRIPE_HEADER, &stripe_header(&secret, 1_000, body));
        let secrets = [secret.clone()];
        assert_eq!(
            verify(&STRIPE, &secrets, &h, br#"{"id":"evt_1","amount":999}"#, 1_000),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(&STRIPE, &secrets, &h, body, 1_301),
            Err(SignatureError::Stale {
                off_by: 301,
                tolerance: 300
            })
        );
        assert!(matches!(
            verify(&STRIPE, &secrets, &h, body, 699),
            Err(SignatureError::Stale { .. })
        ));
        assert_eq!(
            verify(&STRIPE, &[Secret::new("whsec_b")], &h, body, 1_000),
            Err(SignatureError::Mismatch)
        );
        // Rotation: the old secret among the current ones still verifies.
        assert_eq!(
            verify(&STRIPE, &[Secret::new("whsec_b"), secret], &h, body, 1_000),
            Ok(())
        );
    }

    #[test]
    fn stripe_reads_several_signatures_and_ignores_other_schemes() {
        let secret = Secret::new("whsec_a");
        let body = b"{}";
        let good = stripe_header(&secret, 50, body);
        let v1 = good.split_once(",v1=").unwrap().1;
        let value = format!("t=50,v0=00ff,v1={},v1={v1}", "ab".repeat(32));
        assert_eq!(
            verify(&STRIPE, &[secret], &headers(STRIPE_HEADER, &value), body, 50),
            Ok(())
        );
    }

    #[test]
    fn malformed_headers_are_named_and_never_echoed() {
        let secrets = [Secret::new("s")];
        for (value, reason) in [
            ("v1=abcd", "it has no timestamp (t=)"),
            ("t=12", "it has no v1 signature"),
            ("t=12,v1=zz", "it has no v1 signature"),
            ("t=soon,v1=ab", "t is not a Unix time"),
            ("t=1,t=2,v1=ab", "t is given twice"),
            ("garbage", "an item is not name=value"),
        ] {
            let err = verify(&STRIPE, &secrets, &headers(STRIPE_HEADER, value), b"{}", 12).unwrap_err();
            assert_eq!(
                err,
                SignatureError::Malformed {
                    header: STRIPE_HEADER.into(),
                    reason
                },
                "{value}"
            );
            assert!(!err.to_string().contains(value), "{err}");
        }
        assert_eq!(
            verify(&STRIPE, &secrets, &HeaderMap::new(), b"{}", 12),
            Err(SignatureError::Missing {
                header: STRIPE_HEADER.into()
            })
        );
    }

    #[test]
    fn secrets_equal_but_for_trailing_zero_bytes_are_one_hmac_key() {
        // HMAC pads a short key with zeros (RFC 2104), as every provider's
        // verifier does: such a pair is not two secrets. (The fuzz target
        // once took it for a forgery; its corpus keeps that input.)
        let body = b"{}";
        let signed = headers(
            GITHUB_HEADER,
            &format!("sha256={}", sign_hex(&Secret::new("k\0"), &[body])),
        );
        assert_eq!(
            verify(&Scheme::GitHub, &[Secret::new("k")], &signed, body, 0),
            Ok(())
        );
        assert_eq!(
            verify(&Scheme::GitHub, &[Secret::new("k1")], &signed, body, 0),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn github_and_generic_hmac_sign_the_body() {
        let secret = Secret::new("It's a Secret to Everybody");
        let body = b"Hello, World!";
        // GitHub's documented example for this secret and payload.
        let expected = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(sign_hex(&secret, &[body]), expected);
        let secrets = [secret];
        let gh = headers(GITHUB_HEADER, &format!("sha256={expected}"));
        assert_eq!(verify(&Scheme::GitHub, &secrets, &gh, body, 0), Ok(()));
        assert_eq!(
            verify(&Scheme::GitHub, &secrets, &gh, b"Hello, World?", 0),
            Err(SignatureError::Mismatch)
        );
        let bare = headers(GITHUB_HEADER, expected);
        assert!(matches!(
            verify(&Scheme::GitHub, &secrets, &bare, body, 0),
            Err(SignatureError::Malformed { .. })
        ));

        let hex_scheme = Scheme::Hmac {
            header: "X-Signature".into(),
            encoding: Encoding::Hex,
        };
        for value in [
            expected.to_owned(),
            expected.to_uppercase(),
            format!("sha256={expected}"),
        ] {
            let h = headers("x-signature", &value);
            assert_eq!(verify(&hex_scheme, &secrets, &h, body, 0), Ok(()), "{value}");
        }
        let b64 = base64::engine::general_purpose::STANDARD.encode(hex::decode(expected).unwrap());
        let b64_scheme = Scheme::Hmac {
            header: "x-signature".into(),
            encoding: Encoding::Base64,
        };
        assert_eq!(
            verify(&b64_scheme, &secrets, &headers("x-signature", &b64), body, 0),
            Ok(())
        );
        assert!(matches!(
            verify(&hex_scheme, &secrets, &headers("x-signature", &b64), body, 0),
            Err(SignatureError::Malformed { .. })
        ));
    }

    fn not_bearer() -> SignatureError {
        SignatureError::Malformed {
            header: AUTHORIZATION_HEADER.into(),
            reason: "it is not `Bearer <token>`",
        }
    }

    #[test]
    fn a_bearer_token_is_one_of_the_secrets_or_refused_without_echo() {
        let secrets = [Secret::new("old-token"), Secret::new("new-token")];
        for value in ["Bearer new-token", "bearer old-token", "BEARER  new-token "] {
            let h = headers(AUTHORIZATION_HEADER, value);
            assert_eq!(verify(&Scheme::Bearer, &secrets, &h, b"", 0), Ok(()), "{value}");
        }
        for (value, expected) in [
            ("Bearer new-token2", SignatureError::WrongToken),
            ("Bearer x new-token", SignatureError::WrongToken),
            ("Bearer ", not_bearer()),
            ("Basic bmV3LXRva2Vu", not_bearer()),
        ] {
            let h = headers(AUTHORIZATION_HEADER, value);
            let refused = verify(&Scheme::Bearer, &secrets, &h, b"", 0).unwrap_err();
            assert!(!refused.to_string().contains("token2"), "{refused}");
            assert_eq!(refused, expected, "{value}");
        }
        assert_eq!(
            verify(&Scheme::Bearer, &secrets, &HeaderMap::new(), b"", 0),
            Err(SignatureError::Missing {
                header: AUTHORIZATION_HEADER.into()
            })
        );
    }
}
