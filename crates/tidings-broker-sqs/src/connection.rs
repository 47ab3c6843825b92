//! [`SqsTransport`]: the SNS and SQS clients, configured the standard AWS
//! way, and what this transport declared so far.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::timeout::TimeoutConfig;
use tidings_core::{Error, Result};

use crate::{SqsOptions, TRANSPORT};

/// Amazon SNS and SQS, usable as publisher and subscriber. Cheap to clone.
///
/// Credentials, region and endpoint come from the standard AWS
/// configuration (`AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_PROFILE`, an
/// instance role, `AWS_ENDPOINT_URL` for moto or LocalStack), unless the
/// URL or [`SqsOptions`] name a region or an endpoint.
#[derive(Clone)]
pub struct SqsTransport {
    pub(crate) sns: aws_sdk_sns::Client,
    pub(crate) sqs: aws_sdk_sqs::Client,
    pub(crate) options: SqsOptions,
    pub(crate) declared: Arc<Declared>,
    endpoint: Option<String>,
    /// Receives never wait at the service: it is an emulator (a plain
    /// `http://` endpoint, moto or LocalStack). Moto's waiting receive spins
    /// without pause while a FIFO queue's visible messages all belong to
    /// message groups in flight, taking a whole core for the wait.
    pub(crate) short_polls: bool,
}

/// What this transport made or found, so that each is asked for once.
#[derive(Default)]
pub(crate) struct Declared {
    /// SNS topic name → ARN.
    pub(crate) topics: Mutex<HashMap<String, String>>,
    /// SNS topic ARNs known to have a subscription.
    pub(crate) subscribed: Mutex<HashSet<String>>,
    /// SQS queue name → URL.
    pub(crate) queues: Mutex<HashMap<String, String>>,
    /// `(topic, group)` whose queues and subscriptions are in place.
    pub(crate) groups: Mutex<HashSet<(String, String)>>,
}

impl Declared {
    /// Forgets `group`'s queues on `topic` (named `queues`) and the topic
    /// itself, so that the next declaration asks SQS and SNS again: one of
    /// them was deleted while in use.
    pub(crate) fn forget_group(&self, topic_name: &str, group: (String, String), queues: &[String]) {
        self.groups.lock().unwrap().remove(&group);
        let mut known = self.queues.lock().unwrap();
        for name in queues {
            known.remove(name);
        }
        self.forget_topic(topic_name);
    }

    /// Forgets SNS topic `name` and that anything subscribes to it.
    pub(crate) fn forget_topic(&self, name: &str) {
        if let Some(arn) = self.topics.lock().unwrap().remove(name) {
            self.subscribed.lock().unwrap().remove(&arn);
        }
    }
}

impl fmt::Debug for SqsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsTransport")
            .field("endpoint", &self.endpoint)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl SqsTransport {
    /// Connects to the services `url` names (`sqs://`, `sqs://REGION`,
    /// `sqs://?endpoint=http://127.0.0.1:5000`).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, SqsOptions::default()).await
    }

    /// Connects with options; checks that SQS answers with the credentials found.
    pub async fn connect_with(url: &str, options: SqsOptions) -> Result<Self> {
        let options = options.with_url(url)?;
        let mut loader = aws_config::defaults(BehaviorVersion::latest()).timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                // A receive waits up to `receive_wait` for a message.
                .operation_attempt_timeout(options.receive_wait + Duration::from_secs(15))
                .build(),
        );
        if let Some(region) = &options.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        if let Some(endpoint) = &options.endpoint {
            loader = loader.endpoint_url(endpoint.clone());
        }
        if let Some(key) = &options.credentials {
            loader = loader.credentials_provider(aws_sdk_sqs::config::Credentials::new(
                key.access_key_id.clone(),
                key.secret_access_key.clone(),
                None,
                None,
                "tidings static credentials",
            ));
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err(Error::Config {
                key: "transport URL".into(),
                reason: "no AWS region: set AWS_REGION (or a profile's region), or name it in the URL \
                         (sqs://eu-west-1)"
                    .into(),
            });
        }
        let endpoint = options
            .endpoint
            .clone()
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok());
        let transport = SqsTransport {
            sns: aws_sdk_sns::Client::new(&config),
            sqs: aws_sdk_sqs::Client::new(&config),
            options,
            declared: Arc::default(),
            short_polls: endpoint.as_deref().is_some_and(|e| e.starts_with("http://")),
            endpoint,
        };
        transport
            .sqs
            .list_queues()
            .max_results(1)
            .send()
            .await
            .map_err(|e| transport.error(&format!("reaching SQS at {}", transport.place()), e))?;
        Ok(transport)
    }

    /// Where the services are, for messages: the endpoint, or AWS's own.
    pub fn place(&self) -> String {
        self.endpoint
            .clone()
            .unwrap_or_else(|| "AWS's endpoint".to_owned())
    }

    /// An SDK error as a transport error: what was being done, the
    /// service's code and message; retryable unless the request itself
    /// was at fault (a refused message, a missing permission).
    pub(crate) fn error<E, R>(&self, what: &str, e: aws_sdk_sqs::error::SdkError<E, R>) -> Error
    where
        E: std::error::Error + aws_sdk_sqs::error::ProvideErrorMetadata + Send + Sync + 'static,
        R: fmt::Debug + Send + Sync + 'static,
    {
        // Only a fault of the request itself is permanent: one message SNS
        // will never take. Credentials and permissions fail every request
        // alike, and are fixed by an operator, not by setting records aside.
        let retryable = match &e {
            aws_sdk_sqs::error::SdkError::ServiceError(s) => !matches!(
                s.err().code(),
                Some(
                    "InvalidParameter"
                        | "InvalidParameterValue"
                        | "InvalidParameterException"
                        | "InvalidMessageContents"
                )
            ),
            _ => true,
        };
        let detail = aws_sdk_sqs::error::DisplayErrorContext(&e).to_string();
        Error::transport_reason(TRANSPORT, format!("{what}: {detail}"), retryable)
    }
}
