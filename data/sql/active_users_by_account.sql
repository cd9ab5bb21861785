-- Beyond the seed: WHERE, expressions, AVG and HAVING over the seed's users topic. Users whose last
-- change is not a delete ('d'), per account, once an account has two of them. A user whose new
-- version stops matching the WHERE (op 'd') is taken out of its account's row, and an account that
-- falls under two users gets a tombstone, as Flink SQL gives on an upsert table.
-- Run: python -m pipeline sql data/sql/active_users_by_account.sql

CREATE TABLE users (
uid STRING,
accountId STRING,
id INT,
fullName STRING,
op STRING,
eventTime TIMESTAMP(3) METADATA,
properties MAP<STRING, STRING> METADATA ,
topic STRING METADATA VIRTUAL,
sequenceId BIGINT METADATA VIRTUAL,
PRIMARY KEY (uid) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/users',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

CREATE TABLE active_users_by_account (
accountId STRING,
activeUsers BIGINT,
avgId INT,
longestName INT,
label STRING,
PRIMARY KEY (accountId) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/active_users_by_account',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

INSERT INTO active_users_by_account (accountId, activeUsers, avgId, longestName, label)
SELECT
accountId,
COUNT(*) AS activeUsers,
AVG(id) AS avgId,
MAX(CHAR_LENGTH(TRIM(fullName))) AS longestName,
CASE WHEN COUNT(*) >= 3 THEN 'large' ELSE 'small' END || ' account ' || accountId AS label
FROM users
WHERE COALESCE(op, 'c') <> 'd' AND id IS NOT NULL
GROUP BY accountId
HAVING COUNT(*) >= 2;
