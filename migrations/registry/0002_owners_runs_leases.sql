-- Scope owners, run reservations, deployment leases (being written).
SELECT 1;
