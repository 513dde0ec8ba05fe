"""The network: two conv blocks, global pooling, dropout and a linear head."""

from torch import nn


class SmallConvNet(nn.Module):
    def __init__(self, num_classes=4, dropout=0.1):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.classifier(self.drop(self.features(x).flatten(1)))
