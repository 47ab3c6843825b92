//! `tidings cdc`: the replication slot and publication of a CDC relay group
//! (`relay.mode = "cdc"`): their state, from the database or through a
//! running daemon's console, and dropping them.

use anyhow::Context as _;
use tidings::AnyStore;
use tidings_cdc_postgres::slot::{self, SlotName};
use tidings_core::inspect::ReplicationSlot;

use crate::daemon_client::Daemon;

/// What to do with a CDC relay group's slot.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum CdcCommand {
    /// The slot's state: whether a relay streams it, and how much
    /// write-ahead log the server keeps for it.
    Status(GroupArg),
    /// Drops the slot and the publication, ending the stream of a relay
    /// still reading it. Nothing is lost: the outbox keeps every record not
    /// sent, and a CDC relay started afterwards makes both again and sends
    /// those records first. Run it when leaving CDC mode, or for a relay
    /// group that is gone (its slot keeps the server's log forever).
    Drop(GroupArg),
}

#[derive(Debug, clap::Args)]
pub(crate) struct GroupArg {
    /// The relay group (`relay.group`): the slot is `tidings_<group>`.
    #[arg(long, default_value = "relay", env = "TIDINGS_RELAY__GROUP")]
    group: String,
}

pub(crate) async fn run(store: AnyStore, command: CdcCommand) -> anyhow::Result<()> {
    let AnyStore::Postgres(pg) = store else {
        anyhow::bail!("CDC relays read PostgreSQL's logical replication: pass a postgres:// --database");
    };
    match command {
        CdcCommand::Status(arg) => {
            let name = SlotName::of_group(&arg.group)?;
            let status = slot::status(pg.pool(), &name).await?.map(|s| ReplicationSlot {
                name: name.as_str().to_owned(),
                active: s.active,
                retained_bytes: s.retained_bytes.max(0).unsigned_abs(),
                unconfirmed_bytes: s.unconfirmed_bytes.max(0).unsigned_abs(),
            });
            print_status(&arg.group, &name, status.as_ref())?;
        }
        CdcCommand::Drop(arg) => {
            let name = SlotName::of_group(&arg.group)?;
            let dropped = slot::drop(pg.pool(), &name)
                .await
                .with_context(|| format!("dropping the slot and publication {name}"))?;
            if dropped {
                say!("dropped the slot and the publication {name}");
            } else {
                say!("no slot {name}; the publication {name} is dropped if it was there");
            }
        }
    }
    Ok(())
}

/// The same, through a daemon's console: the status as it reads it;
/// dropping stays with whoever holds the database's credentials.
pub(crate) async fn remote(daemon: &Daemon, command: CdcCommand) -> anyhow::Result<()> {
    match command {
        CdcCommand::Status(arg) => {
            let name = SlotName::of_group(&arg.group)?;
            let slots: Vec<ReplicationSlot> = daemon.get("/slots", &()).await?;
            let status = slots.into_iter().find(|s| s.name == name.as_str());
            print_status(&arg.group, &name, status.as_ref())
        }
        CdcCommand::Drop(_) => anyhow::bail!(
            "dropping a slot needs the database's replication rights, which the console does not lend: \
             run `tidings cdc drop --database URL`"
        ),
    }
}

fn print_status(group: &str, name: &SlotName, status: Option<&ReplicationSlot>) -> anyhow::Result<()> {
    match status {
        None => say!("no slot {name}: no CDC relay of group {group:?} has started here"),
        Some(s) => {
            say!("slot              {name}");
            say!("streamed now      {}", if s.active { "yes" } else { "no" });
            say!("log retained      {} bytes", s.retained_bytes);
            say!("not confirmed     {} bytes", s.unconfirmed_bytes);
        }
    }
    Ok(())
}
