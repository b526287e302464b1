-- Registry: usage a gateway settled (issue 24 item 5, `[billing] mode = "report"`). In report mode
-- the gateway is the billing authority: `/admin/mark-settled` moves a record from pending to
-- `reported` (settled elsewhere: no charge, no ledger row here); `settled` keeps meaning charged by
-- this daemon, with its ledger row. The two checks on the settlement state are replaced.
DO $$
DECLARE c record;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = 'compute_usage_log'::regclass AND contype = 'c'
               AND pg_get_constraintdef(oid) LIKE '%settlement_status%'
    LOOP
        EXECUTE format('ALTER TABLE compute_usage_log DROP CONSTRAINT %I', c.conname);
    END LOOP;
END $$;
ALTER TABLE compute_usage_log ADD CONSTRAINT compute_usage_status
    CHECK (settlement_status IN ('pending', 'settled', 'reported'));
ALTER TABLE compute_usage_log ADD CONSTRAINT compute_usage_settled_ledger
    CHECK ((settlement_status = 'settled') = (ledger_entry_id IS NOT NULL));
ALTER TABLE compute_usage_log ADD CONSTRAINT compute_usage_settled_at
    CHECK ((settlement_status = 'pending') = (settled_at IS NULL));
INSERT INTO usage_state_transitions (from_state, to_state) VALUES ('pending', 'reported');
