//! The registry (control database): scopes and their state machine, in SQLite.
