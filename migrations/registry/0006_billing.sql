-- Accounts, usage log, wallet ledger (being written).
SELECT 1;
