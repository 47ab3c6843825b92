//! Whether a message's name reads as its kind says: events in the past
//! tense (`OrderPlaced`), commands in the imperative (`PlaceOrder`).
//!
//! The check is a heuristic over English words, kept deliberately small:
//! regular past forms end in `ed`, irregular ones come from a list, and a
//! few words that end in `ed` without being past forms (`Feed`, `Proceed`)
//! are known. `#[message(name_check = false)]` turns it off for a type.

/// How a word reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tense {
    /// Only a past form (`Placed`, `Sent`, `Taken`).
    Past,
    /// A past form that is also the present (`Set`, `Put`, `Reset`), or a
    /// past form that is also another verb (`Found`, `Wound`).
    Either,
    /// Not a past form.
    Other,
}

/// Words that end in `ed` but are not past forms.
const NOT_PAST_ED: &[&str] = &[
    "bed", "bleed", "breed", "creed", "deed", "embed", "exceed", "feed", "greed", "heed", "indeed", "need",
    "proceed", "red", "reed", "seed", "sled", "speed", "steed", "succeed", "tweed", "weed",
];

/// Irregular past forms and past participles that are nothing else.
const IRREGULAR: &[&str] = &[
    "arisen",
    "arose",
    "ate",
    "awoke",
    "awoken",
    "beaten",
    "became",
    "began",
    "begun",
    "bent",
    "bitten",
    "blew",
    "blown",
    "born",
    "borne",
    "bought",
    "broke",
    "broken",
    "brought",
    "built",
    "burnt",
    "came",
    "caught",
    "chose",
    "chosen",
    "clung",
    "crept",
    "dealt",
    "did",
    "done",
    "drank",
    "drawn",
    "dreamt",
    "drew",
    "driven",
    "drove",
    "drunk",
    "dug",
    "dwelt",
    "eaten",
    "fallen",
    "felt",
    "flew",
    "flown",
    "flung",
    "forbade",
    "forbidden",
    "forgave",
    "forgiven",
    "forgot",
    "forgotten",
    "forsaken",
    "fought",
    "froze",
    "frozen",
    "gave",
    "given",
    "gone",
    "got",
    "gotten",
    "grew",
    "grown",
    "had",
    "heard",
    "held",
    "hid",
    "hidden",
    "hung",
    "kept",
    "knelt",
    "knew",
    "known",
    "laid",
    "lain",
    "leant",
    "leapt",
    "learnt",
    "left",
    "lent",
    "lit",
    "lost",
    "made",
    "meant",
    "met",
    "paid",
    "proven",
    "ran",
    "rang",
    "ridden",
    "risen",
    "rode",
    "rung",
    "said",
    "sang",
    "sank",
    "sat",
    "seen",
    "sent",
    "sewn",
    "shaken",
    "shone",
    "shook",
    "shorn",
    "shot",
    "shown",
    "shrank",
    "shrunk",
    "slain",
    "slept",
    "slid",
    "slung",
    "smelt",
    "sold",
    "sought",
    "sown",
    "spat",
    "spent",
    "spilt",
    "spoke",
    "spoken",
    "sprang",
    "sprung",
    "stank",
    "stole",
    "stolen",
    "stood",
    "strode",
    "striven",
    "strove",
    "struck",
    "stuck",
    "stung",
    "sung",
    "sunk",
    "swam",
    "swept",
    "swore",
    "sworn",
    "swum",
    "swung",
    "taken",
    "taught",
    "thought",
    "threw",
    "thrown",
    "told",
    "took",
    "tore",
    "torn",
    "trod",
    "trodden",
    "went",
    "wept",
    "woke",
    "woken",
    "won",
    "wore",
    "worn",
    "wove",
    "woven",
    "written",
    "wrote",
];

/// Past forms that are also the present, or also another verb: fine as the
/// verb of an event, and fine as the first word of a command.
const EITHER: &[&str] = &[
    "beat",
    "become",
    "bet",
    "bid",
    "bore",
    "bound",
    "broadcast",
    "burst",
    "cast",
    "come",
    "cost",
    "cut",
    "fell",
    "fit",
    "forecast",
    "found",
    "ground",
    "hit",
    "hurt",
    "let",
    "put",
    "quit",
    "read",
    "rid",
    "run",
    "saw",
    "set",
    "shed",
    "shred",
    "shut",
    "slit",
    "split",
    "spread",
    "thrust",
    "upset",
    "wed",
    "wet",
    "wound",
];

/// Prefixes that keep a verb's tense: `Rebuilt`, `Undone`, `Withdrawn`.
const PREFIXES: &[&str] = &[
    "re", "un", "over", "under", "with", "mis", "out", "up", "fore", "pre",
];

/// Prepositions and particles: in `ItemAddedToCart` or `UserLoggedIn` the
/// verb is the word before one of these.
const PARTICLES: &[&str] = &[
    "about", "after", "against", "along", "around", "as", "aside", "at", "away", "back", "before", "by",
    "down", "for", "from", "in", "into", "of", "off", "on", "onto", "out", "over", "per", "through", "to",
    "up", "via", "with", "within", "without",
];

/// Irregular past forms named in error messages.
pub(crate) const IRREGULAR_EXAMPLES: &str = "`Sent`, `Paid`, `Built`, `Taken`, `Done`";

fn listed(list: &[&str], word: &str) -> bool {
    list.contains(&word)
        || PREFIXES.iter().any(|prefix| {
            word.strip_prefix(prefix)
                .is_some_and(|rest| rest.len() >= 2 && list.contains(&rest))
        })
}

/// How `word` reads, ignoring case.
pub(crate) fn tense(word: &str) -> Tense {
    let word = word.to_lowercase();
    if NOT_PAST_ED.contains(&word.as_str()) {
        Tense::Other
    } else if listed(IRREGULAR, &word) {
        Tense::Past
    } else if listed(EITHER, &word) {
        Tense::Either
    } else if word.len() > 2 && word.ends_with("ed") {
        Tense::Past
    } else {
        Tense::Other
    }
}

fn is_particle(word: &str) -> bool {
    PARTICLES.contains(&word.to_lowercase().as_str())
}

/// Splits a type name into words: CamelCase humps, acronyms
/// (`HTTPRequestSent` is `HTTP`, `Request`, `Sent`) and anything between
/// separators (`order.placed`, `order_placed`). Digits stay with the word
/// before them (`V2`).
pub(crate) fn words(name: &str) -> Vec<String> {
    let mut words = Vec::new();
    for part in name.split(|c: char| !c.is_alphanumeric()) {
        let chars: Vec<char> = part.chars().collect();
        let mut word = String::new();
        for (i, &c) in chars.iter().enumerate() {
            let prev = i.checked_sub(1).map(|j| chars[j]);
            let next = chars.get(i + 1).copied();
            let boundary = c.is_uppercase()
                && match prev {
                    Some(p) if p.is_lowercase() || p.is_numeric() => true,
                    Some(p) if p.is_uppercase() => next.is_some_and(char::is_lowercase),
                    _ => false,
                };
            if boundary && !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            word.push(c);
        }
        if !word.is_empty() {
            words.push(word);
        }
    }
    words
}

/// A version suffix such as `V2` or `2`, ignored at the end of a name.
fn is_version(word: &str) -> bool {
    let digits = word.strip_prefix(['v', 'V']).unwrap_or(word);
    !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
}

/// The words of `name` without a trailing version suffix.
fn significant_words(name: &str) -> Vec<String> {
    let mut words = words(name);
    while words.len() > 1 && words.last().is_some_and(|w| is_version(w)) {
        words.pop();
    }
    words
}

/// Why a name does not read as its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Misnamed {
    /// An event whose verb is not a past form; holds the word checked.
    EventNotPast(String),
    /// A command whose first word is a past form; holds that word.
    CommandPast(String),
    /// A name with no letters at all.
    NoWords,
}

/// Checks an event's name: its last word, or a word just before a
/// preposition or particle (`ItemAddedToCart`, `UserLoggedIn`), is a past
/// form.
pub(crate) fn check_event(name: &str) -> Result<(), Misnamed> {
    let words = significant_words(name);
    let Some(last) = words.last() else {
        return Err(Misnamed::NoWords);
    };
    let past = |w: &String| tense(w) != Tense::Other;
    let before_particle = words
        .windows(2)
        .any(|pair| is_particle(&pair[1]) && past(&pair[0]));
    if past(last) || before_particle {
        Ok(())
    } else {
        let mut verb = words.iter().rev().skip_while(|w| is_particle(w));
        Err(Misnamed::EventNotPast(verb.next().unwrap_or(last).clone()))
    }
}

/// Checks a command's name: its first word, the verb, is not a past form.
pub(crate) fn check_command(name: &str) -> Result<(), Misnamed> {
    let words = significant_words(name);
    let Some(first) = words.first() else {
        return Err(Misnamed::NoWords);
    };
    if tense(first) == Tense::Past {
        Err(Misnamed::CommandPast(first.clone()))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_camel_case_acronyms_and_separators() {
        assert_eq!(words("OrderPlaced"), ["Order", "Placed"]);
        assert_eq!(words("HTTPRequestSent"), ["HTTP", "Request", "Sent"]);
        assert_eq!(words("OrderPlacedV2"), ["Order", "Placed", "V2"]);
        assert_eq!(words("order.placed"), ["order", "placed"]);
        assert_eq!(words("order_placed_v3"), ["order", "placed", "v3"]);
        assert_eq!(words("SKUAdded"), ["SKU", "Added"]);
        assert_eq!(words("Sent"), ["Sent"]);
        assert!(words("").is_empty());
        assert!(words("__").is_empty());
    }

    #[test]
    fn tenses() {
        for past in [
            "Placed",
            "Shipped",
            "Sent",
            "Paid",
            "Taken",
            "Rebuilt",
            "Withdrawn",
            "Undone",
        ] {
            assert_eq!(tense(past), Tense::Past, "{past}");
        }
        for either in ["Set", "Reset", "Put", "Read", "Run", "Rerun", "Found", "Cut"] {
            assert_eq!(tense(either), Tense::Either, "{either}");
        }
        for other in [
            "Place", "Order", "Feed", "Proceed", "Need", "Speed", "Ed", "Capture",
        ] {
            assert_eq!(tense(other), Tense::Other, "{other}");
        }
    }

    #[test]
    fn events_are_past() {
        for ok in [
            "OrderPlaced",
            "OrderShipped",
            "PaymentCaptured",
            "InvoiceSent",
            "OrderPaid",
            "ReportWritten",
            "PasswordReset",
            "ItemAddedToCart",
            "UserLoggedIn",
            "UserLoggedInFromNewDevice",
            "OrderCheckedOut",
            "CheckInCompleted",
            "OrderPlacedV2",
            "order.placed",
            "Delivered",
        ] {
            assert_eq!(check_event(ok), Ok(()), "{ok}");
        }
        let not = |w: &str| Err(Misnamed::EventNotPast(w.into()));
        assert_eq!(check_event("PlaceOrder"), not("Order"));
        assert_eq!(check_event("OrderPlace"), not("Place"));
        assert_eq!(check_event("GameOver"), not("Game"));
        assert_eq!(check_event("PriceFeed"), not("Feed"));
        assert_eq!(check_event("SendEmailToUser"), not("User"));
        assert_eq!(check_event("__"), Err(Misnamed::NoWords));
    }

    #[test]
    fn commands_are_imperative() {
        for ok in [
            "PlaceOrder",
            "CapturePayment",
            "ShipOrder",
            "ProceedToCheckout",
            "FeedCatalog",
            "ResetPassword",
            "SetPrice",
            "RunReport",
            "MarkAsPaid",
        ] {
            assert_eq!(check_command(ok), Ok(()), "{ok}");
        }
        let past = |w: &str| Err(Misnamed::CommandPast(w.into()));
        assert_eq!(check_command("PlacedOrder"), past("Placed"));
        assert_eq!(check_command("SentInvoice"), past("Sent"));
        assert_eq!(check_command("Shipped"), past("Shipped"));
    }
}
