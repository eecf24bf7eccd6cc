"""Pool history in ClickHouse through clickhouse-connect; chDB (`chdb://`) embedded."""
