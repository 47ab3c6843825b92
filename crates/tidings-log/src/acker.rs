//! Settling one delivery: an ack or a term settles its entry in the window,
//! a nak redelivers it from memory after the delay.

use std::sync::Arc;

use async_trait::async_trait;
use tidings_core::log::LogPosition;
use tidings_core::{AckKind, Acker, Delivery, RawMessage, Result};

use crate::window::{Sender, Shared};

#[derive(Debug)]
pub(crate) struct LogAcker {
    pub(crate) shared: Arc<Shared>,
    pub(crate) at: LogPosition,
    pub(crate) message: RawMessage,
    pub(crate) count: u32,
    pub(crate) sender: Sender,
}

#[async_trait]
impl Acker for LogAcker {
    async fn ack(&self, kind: AckKind) -> Result<()> {
        match kind {
            AckKind::Ack | AckKind::Term => {
                self.shared.window.lock().expect("window lock").settle(self.at);
                self.shared.settled_signal.notify_one();
            }
            AckKind::Progress => {}
            AckKind::Nak(delay) => {
                // Redeliver from memory; the offset stays behind this entry,
                // so a crash before the redelivery settles reads it again.
                let again = LogAcker {
                    shared: self.shared.clone(),
                    at: self.at,
                    message: self.message.clone(),
                    count: self.count + 1,
                    sender: self.sender.clone(),
                };
                let delay = delay.unwrap_or_default();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    // The subscription's own channel: a dropped subscription drops it.
                    let sender = again.sender.clone();
                    let delivery = Delivery::new(again.message.clone(), again.count, again);
                    let _ = sender.send(Ok(delivery)).await;
                });
            }
        }
        Ok(())
    }
}
