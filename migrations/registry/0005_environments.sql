-- Execution environments and background processes (being written).
SELECT 1;
