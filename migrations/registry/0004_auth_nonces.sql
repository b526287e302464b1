-- Single-use nonces of signed /tools requests (being written).
SELECT 1;
