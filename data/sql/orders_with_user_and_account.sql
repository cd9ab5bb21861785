-- Beyond the seed: an N-way chain of foreign-key joins. Each order with its user's name and their
-- account's name, keyed by the order: orders -> users on o.userId (an [INNER] JOIN: an order of no
-- user is not sent, or retracted once its user goes), then users -> accounts on u.accountId, a
-- column of the joined users row (a LEFT JOIN: NULLs while the account is missing). An order that
-- moves to another user, a user who moves to another account, and an account's change or delete
-- each update every order they reach, as Flink SQL gives on upsert tables.
-- Run: python -m pipeline sql data/sql/orders_with_user_and_account.sql

CREATE TABLE orders (
oid STRING,
userId STRING,
amount DOUBLE,
PRIMARY KEY (oid) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/shop_orders',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

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

CREATE TABLE orders_with_user_and_account (
orderId STRING,
amount DOUBLE,
userName STRING,
accountName STRING,
PRIMARY KEY (orderId) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/orders_with_user_and_account',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

INSERT INTO orders_with_user_and_account (orderId, amount, userName, accountName)
SELECT
o.oid,
o.amount,
u.fullName,
a.name
FROM orders AS o
JOIN users AS u ON o.userId = u.uid
LEFT JOIN accounts AS a ON u.accountId = a.id;
