"""REINFORCE in the shape of the policy-gradient examples, on a small environment written here
(no gym): one policy forward per environment step, the log-probabilities and rewards kept in
lists on the policy, and one optimizer step per episode from the normalised rewards-to-go.
Episodes end when the walker leaves the track or runs out of time, so their lengths vary.

The environment draws its start and its noise from a NumPy generator of its own: seeded by the
first ``reset(seed=...)`` (with ``--env-seed``), else from entropy, as gym environments do.
"""

import argparse
from itertools import count

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical

parser = argparse.ArgumentParser(description="PyTorch REINFORCE example")
parser.add_argument("--gamma", type=float, default=0.99, metavar="G", help="discount factor")
parser.add_argument("--seed", type=int, default=543, metavar="N", help="random seed")
parser.add_argument("--env-seed", type=int, default=None, help="seed of the environment")
parser.add_argument("--log-interval", type=int, default=1, metavar="N")
parser.add_argument("--max-episodes", type=int, default=0, help="stop after N episodes (0: never)")
args = parser.parse_args()


class Walker1D:
    """A walker on a track [-limit, limit]: push left or right, against noise; +1 per step."""

    def __init__(self, limit=1.5, max_steps=30):
        self.limit, self.max_steps = limit, max_steps
        self.np_random = None
        self.reward_threshold = max_steps - 2

    def reset(self, seed=None):
        if seed is not None or self.np_random is None:
            self.np_random = np.random.default_rng(seed)
        self.pos = self.np_random.uniform(-0.5, 0.5)
        self.vel = self.np_random.uniform(-0.05, 0.05)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.pos, self.vel], dtype=np.float32)

    def step(self, action):
        self.vel += (0.04 if action == 1 else -0.04) + self.np_random.normal(0.0, 0.03)
        self.pos += self.vel
        self.t += 1
        terminated = bool(abs(self.pos) > self.limit)
        truncated = self.t >= self.max_steps
        return self._obs(), 1.0, terminated, truncated, {}


env = Walker1D()
if args.env_seed is not None:
    env.reset(seed=args.env_seed)
torch.manual_seed(args.seed)


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(2, 32)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(32, 2)
        self.saved_log_probs = []
        self.rewards = []

    def forward(self, x):
        x = F.relu(self.dropout(self.affine1(x)))
        return F.softmax(self.affine2(x), dim=1)


policy = Policy()
optimizer = optim.Adam(policy.parameters(), lr=1e-2)
eps = np.finfo(np.float32).eps.item()


def select_action(state):
    state = torch.from_numpy(state).float().unsqueeze(0)
    probs = policy(state)
    m = Categorical(probs)
    action = m.sample()
    policy.saved_log_probs.append(m.log_prob(action))
    return action.item()


def finish_episode():
    R = 0
    returns = []
    for r in policy.rewards[::-1]:
        R = r + args.gamma * R
        returns.insert(0, R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)
    policy_loss = torch.cat(
        [-log_prob * R for log_prob, R in zip(policy.saved_log_probs, returns, strict=True)]
    )
    optimizer.zero_grad()
    policy_loss.sum().backward()
    optimizer.step()
    del policy.rewards[:]
    del policy.saved_log_probs[:]


def main():
    running_reward = 10
    for i_episode in count(1):
        state, _ = env.reset()
        ep_reward = 0
        for _t in range(1, 10000):  # don't loop forever
            action = select_action(state)
            state, reward, terminated, truncated, _ = env.step(action)
            policy.rewards.append(reward)
            ep_reward += reward
            if terminated or truncated:
                break
        running_reward = 0.05 * ep_reward + (1 - 0.05) * running_reward
        finish_episode()
        if i_episode % args.log_interval == 0:
            print(
                f"Episode {i_episode}\tLast reward: {ep_reward:.2f}\t"
                f"Average reward: {running_reward:.2f}"
            )
        if running_reward > env.reward_threshold:
            print(f"Solved! Running reward is now {running_reward}")
            break
        if args.max_episodes and i_episode >= args.max_episodes:
            break


if __name__ == "__main__":
    main()
