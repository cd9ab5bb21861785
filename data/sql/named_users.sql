-- Filter and project: each user but an account's first (id 0), with a display name, keyed by uid.
-- No GROUP BY and no join, so the only state is which keys the WHERE let through: a user whose new
-- version stops matching gets a tombstone, as Flink SQL gives on an upsert table. bench/bench_sql.py
-- runs it as the SQL pipelines' near-stateless figure.
-- Run: python -m pipeline sql data/sql/named_users.sql

CREATE TABLE users (
uid STRING,
accountId STRING,
id INT,
fullName STRING,
op STRING,
PRIMARY KEY (uid) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/users',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

CREATE TABLE named_users (
uid STRING,
accountId STRING,
displayName STRING,
PRIMARY KEY (uid) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/named_users',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

INSERT INTO named_users (uid, accountId, displayName)
SELECT uid, accountId, UPPER(TRIM(fullName)) AS displayName
FROM users
WHERE id <> 0 AND COALESCE(op, 'c') <> 'd';
