-- Legacy import audit records (being written).
SELECT 1;
