//! How a database marks a statement's parameters.
//!
//! Every dialect writes its statements with numbered parameters (`$1`,
//! `$2`...), each usable several times or not at all: the statements'
//! fields document them that way ([`Statements`](crate::Statements)).
//! PostgreSQL and SQLite read them so. MySQL marks parameters with `?`,
//! one argument for each mark in the order of the text: for it the store
//! rewrites each `$n` into `?` and binds the `n`th argument there, as often
//! as the text names it ([`Stmt`](crate::db::Stmt) does both).

/// How a database's statements mark their parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholders {
    /// `$1`, `$2`...: the database binds by number (PostgreSQL, SQLite).
    Numbered,
    /// `?`: the database binds in the order of the text (MySQL, MariaDB).
    Positional,
}

/// `sql` with each `$n` outside quotes turned into `?`, and the parameter
/// (from 0) each `?` stands for, in the order of the text.
///
/// ```
/// let (sql, order) = tidings_sql::placeholders::positional(
///     "SELECT a FROM t WHERE ($1 IS NULL OR a = $1) AND b <> '$2' LIMIT $3",
/// );
/// assert_eq!(sql, "SELECT a FROM t WHERE (? IS NULL OR a = ?) AND b <> '$2' LIMIT ?");
/// assert_eq!(order, [0, 0, 2]);
/// ```
pub fn positional(sql: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(sql.len());
    let mut order = Vec::new();
    let mut quote: Option<char> = None;
    let mut chars = sql.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match quote {
            Some(q) => {
                // A doubled quote inside a literal is the quote itself: the
                // literal goes on either way.
                if c == q {
                    quote = None;
                }
                out.push(c);
            }
            None if c == '\'' || c == '"' || c == '`' => {
                quote = Some(c);
                out.push(c);
            }
            None if c == '$' && chars.peek().is_some_and(|(_, d)| d.is_ascii_digit()) => {
                let start = i + 1;
                let mut end = start;
                while let Some(&(j, d)) = chars.peek()
                    && d.is_ascii_digit()
                {
                    end = j + 1;
                    chars.next();
                }
                let n: usize = sql[start..end].parse().unwrap_or(0);
                order.push(n.saturating_sub(1));
                out.push('?');
            }
            None => out.push(c),
        }
    }
    (out, order)
}

#[cfg(test)]
mod tests {
    use super::positional;

    #[test]
    fn each_mark_names_its_parameter_in_text_order() {
        let (sql, order) = positional("INSERT INTO t (a, b) VALUES ($2, $1) ON DUPLICATE KEY UPDATE b = $1");
        assert_eq!(
            sql,
            "INSERT INTO t (a, b) VALUES (?, ?) ON DUPLICATE KEY UPDATE b = ?"
        );
        assert_eq!(order, [1, 0, 0]);
    }

    #[test]
    fn quoted_text_and_other_dollars_stay() {
        let (sql, order) =
            positional("SELECT JSON_EXTRACT(v, '$[0]'), 'it''s $1', `c$1`, \"$2\", $10 FROM t WHERE x = $ 1");
        assert_eq!(
            sql,
            "SELECT JSON_EXTRACT(v, '$[0]'), 'it''s $1', `c$1`, \"$2\", ? FROM t WHERE x = $ 1"
        );
        assert_eq!(order, [9]);
    }

    #[test]
    fn a_statement_without_parameters_is_unchanged() {
        let (sql, order) = positional("SELECT max(version) FROM tidings_migrations");
        assert_eq!(sql, "SELECT max(version) FROM tidings_migrations");
        assert!(order.is_empty());
    }
}
