-- Beyond the seed: a foreign-key join. Each user with their account's name and plan, keyed by
-- the user: a user who moves to another account follows it, an account that changes updates every
-- user in it, and a deleted account leaves its users with NULLs (LEFT JOIN; an [INNER] JOIN would
-- retract them), as Flink SQL gives on upsert tables.
-- Run: python -m pipeline sql data/sql/users_with_their_account.sql

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

CREATE TABLE accounts (
id STRING,
name STRING,
plan STRING,
PRIMARY KEY (id) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/accounts',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

CREATE TABLE users_with_their_account (
userUid STRING,
fullName STRING,
accountId STRING,
accountName STRING,
accountPlan STRING,
PRIMARY KEY (userUid) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/users_with_their_account',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

INSERT INTO users_with_their_account (userUid, fullName, accountId, accountName, accountPlan)
SELECT
u.uid,
u.fullName,
u.accountId,
a.name,
COALESCE(a.plan, 'none')
FROM users AS u
LEFT JOIN accounts AS a ON u.accountId = a.id;
